"""Causal language-model pre-training on a text corpus at a fixed length.

Documents of the training split are tokenized, each followed by EOS, concatenated and cut into
non-overlapping windows of ``model.max_seq_len + 1`` tokens, visited in a fresh random order each epoch
(the paper: C4, 1024 tokens, 12 layers x 768, batch 512, 10k steps, lr 1e-4). The run's checkpoint (and
its tokenizer) is what ``perplexity``, ``passkey`` and ``scrolls`` start from with ``--init RUN_DIR``.

Evaluation: held-out perplexity at the training length (non-overlapping chunks), next to the perplexity of
the held-out text's own unigram distribution (``unigram_ppl`` = exp of its entropy): the best any
context-free model could do, so a model that uses context must land well below it.
"""

from __future__ import annotations

import math
from typing import Any

from posbench.evaluation.metrics import register_metric
from posbench.evaluation.outcome import Evaluation, Metric
from posbench.evaluation.perplexity import evaluate as evaluate_ppl
from posbench.evaluation.perplexity import unigram_entropy
from posbench.tasks.corpus_task import CorpusTask


register_metric("pretrain", "val_ppl", better="lower",
                description="held-out perplexity at the training length (non-overlapping chunks)")
register_metric("pretrain", "val_loss", better="lower",
                description="held-out mean negative log-likelihood per token (nats), the log of val_ppl")
register_metric("pretrain", "unigram_ppl", better="lower",
                description="perplexity of the held-out text's own unigram distribution: the best without context")


class Pretrain(CorpusTask):
    name = "pretrain"
    description = "causal LM pre-training on a corpus (default: the built-in stdlib code corpus); held-out perplexity"

    def evaluate(self, model, device, reporter: Any, phases: dict) -> Evaluation:
        tokens = self.eval_tokens().tokens
        bar = reporter.task("eval", total=1, unit="length") if reporter else None
        res = evaluate_ppl(model, tokens, self.train_length, "chunks", batch_size=self.opts["eval_batch_size"],
                           device=device, start_token=self.start_token)
        if bar:
            bar.update(1)
            bar.close()
        entropy = unigram_entropy(tokens, self.tokenizer.vocab_size)
        metrics = {
            "val_ppl": Metric(res.perplexity, None, res.tokens_scored),
            "val_loss": Metric(res.mean_nll, None, res.tokens_scored),
            "unigram_ppl": Metric(math.exp(entropy), None, len(tokens)),
        }
        return Evaluation(metrics=metrics, primary="val_ppl",
                          info={"protocol": "chunks", "length": self.train_length, **res.to_dict(),
                                "unigram_entropy_nats": entropy,
                                "note": "unigram_ppl: exp(entropy of the held-out tokens' own unigram distribution)"})
