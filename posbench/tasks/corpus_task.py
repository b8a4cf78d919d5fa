"""Shared pieces of the language-model tasks (pretrain, perplexity, passkey, scrolls): tokenizers resolved
from ``--tokenizer`` or from an ``--init`` run, corpus token streams, and the chunked training stream.

Not a task itself (the leading underscore keeps ``posbench.tasks`` from importing it as one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from posbench.data.batch import Batch
from posbench.data.chunks import CachedChunks
from posbench.data.errors import DataError
from posbench.data.lm import TokenStream, corpus_tokens, training_token_budget
from posbench.data.sources import open_source
from posbench.data.splits import check_splits
from posbench.data.tokenizer import BPETokenizer, Tokenizer, build_tokenizer, parse_bpe_spec, tokenizer_from_spec
from posbench.errors import ConfigError
from posbench.evaluation.length_probe import heldout_losses
from posbench.options import Added, Option, at_least
from posbench.tasks.base import IndexedStream, Task

BPE_TRAIN_CHARS = 2_000_000
#: the length probe's sample (``posbench.evaluation.length_probe``), shared by every corpus task
PROBE_TOKENS = Option(4096, "held-out tokens the in-training probe (train.probe_every) scores at each evaluation "
                      "length; at least the longest length", at_least(2), changes_results=False,
                      added=Added(2, 4096))


def init_tokenizer(source) -> Tokenizer:
    """The tokenizer of the ``--init`` model: the one a posbench run recorded (files in its directory), or a
    pretrained model's own."""
    if source.is_posbench:
        if source.kind == "export":
            from posbench.hf.export_tokenizer import posbench_tokenizer  # transformers: an export's only

            return posbench_tokenizer(source.tokenizer or {}, Path(source.model_dir))
        if not isinstance(source.tokenizer, dict):
            raise ConfigError(f"--init {source.given}: that run recorded no tokenizer (is it a pretrain, perplexity, "
                              f"passkey or scrolls run?)")
        return tokenizer_from_spec(source.tokenizer, source.run_dir)
    from posbench.hf.loading import load_tokenizer  # posbench.hf: only a pretrained model enters it

    return load_tokenizer(source.model_dir)


class TokenizerMixin:
    """Resolves ``self.tokenizer`` once: from ``--init``, from the run directory (resume), or from the
    ``tokenizer`` option (a BPE is trained on ``train_texts()`` and saved with the run)."""

    _tokenizer: Tokenizer | None = None

    def train_texts(self):
        raise DataError("--tokenizer bpe needs a training corpus; this task has none (use --tokenizer byte)")

    def bpe_trained_on(self) -> dict[str, Any]:
        return {}

    _tokenizer_saved = False

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._resolve_tokenizer()
        run_dir = getattr(self, "run_dir", None)
        if run_dir is not None and not self._tokenizer_saved:
            self._tokenizer.save(run_dir)        # the run is self-contained: --init reloads it from here
            self._tokenizer_saved = True
        return self._tokenizer

    def _resolve_tokenizer(self) -> Tokenizer:
        spec = self.opts.get("tokenizer", "byte")
        if self.source is not None:
            if spec not in ("", "byte"):
                raise ConfigError(f"the tokenizer comes from the --init model {self.source.given}; leave "
                                  f"task.tokenizer unset")
            return init_tokenizer(self.source)
        run_dir = getattr(self, "run_dir", None)
        if parse_bpe_spec(spec) is not None and run_dir is not None and (Path(run_dir) / "tokenizer.json").is_file():
            return BPETokenizer.load(run_dir)          # a resumed run keeps the tokenizer it trained
        return build_tokenizer(spec, train_texts=self.train_texts, trained_on=self.bpe_trained_on())


class ChunkStream(IndexedStream):
    """Non-overlapping windows of ``length + 1`` tokens (inputs and next-token targets), visited in a fresh
    random order every epoch; example g is a pure function of (seed, g), so resume is exact and several
    processes read disjoint slices."""

    def __init__(self, seed: int, tokens: np.ndarray, length: int):
        super().__init__(seed)
        self.tokens = torch.as_tensor(tokens, dtype=torch.long)
        self.length = length
        self.n_chunks = (len(tokens) - 1) // length
        if self.n_chunks < 1:
            raise DataError(f"the training text has {len(tokens)} tokens, fewer than one sequence of {length + 1}")
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            self._perms[epoch] = np.random.default_rng([self.seed, 7, epoch]).permutation(self.n_chunks)
        return self._perms[epoch]

    def make_examples(self, start: int, count: int) -> Batch:
        rows = []
        for g in range(start, start + count):
            epoch, pos = divmod(g, self.n_chunks)
            start = int(self._perm(epoch)[pos]) * self.length
            rows.append(self.tokens[start: start + self.length + 1])
        x = torch.stack(rows)
        return Batch(x[:, :-1].contiguous(), x[:, 1:].contiguous())


class CachedChunkStream(IndexedStream):
    """``ChunkStream`` over an on-disk token cache that may still be filling: windows in block-local order
    (``posbench.data.chunks``), so training starts once the first block is tokenised; example g is still a
    pure function of (seed, g)."""

    def __init__(self, seed: int, chunks):
        super().__init__(seed)
        self.chunks = chunks
        chunks.wait_until_ready()

    def make_examples(self, start: int, count: int) -> Batch:
        x = torch.from_numpy(self.chunks.rows(self.seed, start, count))
        return Batch(x[:, :-1].contiguous(), x[:, 1:].contiguous())


class StartTokenStream(IndexedStream):
    """A chunk stream whose every window starts with a start token (``task.start_token``): the window keeps its
    ``length`` inputs, BOS and the chunk's first ``length - 1`` tokens, and predicts the chunk's first ``length``
    tokens (the first from BOS alone). Example g is the chunk stream's example g."""

    def __init__(self, chunks: IndexedStream, bos: int):
        super().__init__(chunks.seed)
        self.chunks, self.bos = chunks, int(bos)

    def make_examples(self, start: int, count: int) -> Batch:
        inputs = self.chunks.make_examples(start, count).tokens
        first = torch.full((inputs.shape[0], 1), self.bos, dtype=inputs.dtype)
        return Batch(torch.cat((first, inputs[:, :-1]), dim=1), inputs.clone())


def chunk_stream(seed: int, tokens, length: int) -> IndexedStream:
    """The training stream over ``posbench.data.lm.corpus_tokens``' result: ``ChunkStream`` for in-memory
    tokens (unchanged), ``CachedChunkStream`` for a token cache."""
    if isinstance(tokens, TokenStream):
        return ChunkStream(seed, tokens.tokens, length)
    return CachedChunkStream(seed, CachedChunks(tokens, length))


class CorpusTask(TokenizerMixin, Task):
    """Common base of ``pretrain`` and ``perplexity``: a corpus, a tokenizer, a chunked training stream and a
    held-out token stream."""

    abstract = True            # a base of pretrain and perplexity, not a task of its own

    OPTIONS = {
        "data": Option("stdlib", "corpus: stdlib (built in), a .jsonl/.json/.parquet/.txt file or directory, or a hub "
                       "name"),
        "text_field": Option("text", "the field holding each document's text"),
        "tokenizer": Option("byte", "byte, bpe or bpe:VOCAB (trained on the corpus, saved with the run), or an HF "
                            "name/path"),
        "max_train_tokens": Option(0, "training tokens read from the corpus (0: what training uses, steps x batch_size "
                                   "x max_seq_len + 1; the built-in corpus: all of it)", at_least(0)),
        "eval_tokens": Option(65536, "held-out tokens evaluated (0: the whole held-out split)", at_least(0)),
        "eval_batch_size": Option(8, "windows per forward pass in evaluation", at_least(1), changes_results=False),
        "bpe_train_chars": Option(BPE_TRAIN_CHARS, "characters of the training split a BPE tokenizer is trained on",
                                  at_least(1)),
        "start_token": Option(False, "begin every training and evaluation window with the tokenizer's BOS (windows "
                                     "are cut mid-document; NoPE counts positions from a first token)",
                              added=Added(2, False)),
        "probe_tokens": PROBE_TOKENS,
    }

    _train: TokenStream | None = None
    _eval: TokenStream | None = None

    @property
    def corpus(self):
        if getattr(self, "_corpus", None) is None:
            self._corpus = open_source(self.opts["data"], text_field=self.opts["text_field"])
        return self._corpus

    def train_texts(self):
        budget = self.opts["bpe_train_chars"]

        def texts():
            used = 0
            for text in self.corpus.documents("train"):
                yield text
                used += len(text)
                if used >= budget:
                    break
        return texts()

    def bpe_trained_on(self) -> dict[str, Any]:
        return {"source": self.corpus.spec, "split": "train", "max_chars": self.opts["bpe_train_chars"]}

    @property
    def train_length(self) -> int:
        return int(self.config.model.get("max_seq_len") or 0)

    def validate(self) -> None:
        if self.train_length < 2:
            raise ConfigError(f"model.max_seq_len (the training length) must be >= 2, got {self.train_length}")
        self.corpus.check_online()                        # fail before the run directory exists
        self.splits = check_splits(self.corpus)            # the held-out split exists: checked before training
        if self.config.training.probe_every and self.config.training.steps:
            self.probe_sample()                            # the probe's sample holds its windows: checked now

    def check_heldout_length(self) -> None:
        """Refuse, in one line, held-out text shorter than the longest evaluation length."""
        available = len(self.eval_tokens().tokens)
        if max(self.lengths()) > available:
            raise DataError(f"the held-out text has {available} tokens, fewer than the longest evaluation length "
                            f"{max(self.lengths())}; raise task.eval_tokens or lower task.length_factors")

    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def train_budget(self) -> int | None:
        """Training tokens to read (None: the whole split, the built-in corpus's default)."""
        if self.corpus.kind == "builtin" and not self.opts["max_train_tokens"]:
            return None
        train = self.config.training
        return training_token_budget(self.opts["max_train_tokens"], train.steps, train.batch_size, self.train_length)

    def train_tokens(self):
        if self._train is None:
            self._train = corpus_tokens(self.corpus, "train", self.tokenizer, self.train_budget())
        return self._train

    def eval_tokens(self):
        if self._eval is None:
            self._eval = corpus_tokens(self.corpus, "validation", self.tokenizer, self.opts["eval_tokens"] or None)
            if len(self._eval.tokens) < 2:
                raise DataError(f"the held-out split of '{self.corpus.spec}' is empty; give the data a validation "
                                f"file or more documents")
        return self._eval

    def factors(self) -> list[float]:
        """The evaluation lengths as multiples of the training length (1; perplexity: its length factors)."""
        return [1]

    def lengths(self) -> list[int]:
        """The evaluation lengths in tokens."""
        return [round(f * self.train_length) for f in self.factors()]

    def probe(self, model, device) -> dict[str, float]:
        """Held-out loss at each evaluation length on the first ``probe_tokens`` held-out tokens
        (``posbench.evaluation.length_probe``)."""
        return heldout_losses(model, self.probe_sample(), dict(zip(self.factors(), self.lengths())), device=device,
                              batch_size=self.opts["eval_batch_size"], start_token=self.start_token)

    def probe_sample(self):
        """The probe's tokens; refused in one line where they hold no window of the longest length."""
        self.check_heldout_length()
        tokens = self.eval_tokens().tokens[: self.opts["probe_tokens"]]
        if len(tokens) < max(self.lengths()):
            raise ConfigError(f"task.probe_tokens: the probe's {len(tokens)} held-out tokens hold no window of "
                              f"{max(self.lengths())} tokens (the longest evaluation length); raise task.probe_tokens")
        return tokens

    def train_stream(self) -> IndexedStream:
        stream = chunk_stream(self.config.seed, self.train_tokens(), self.train_length)
        return StartTokenStream(stream, self.tokenizer.bos_id) if self.start_token is not None else stream

    @property
    def start_token(self) -> int | None:
        """The token every window starts with (``task.start_token``; a task that does not declare it: none)."""
        return self.tokenizer.bos_id if self.opts.get("start_token") else None

    def data_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"source": self.corpus.spec, "source_info": self.corpus.describe(),
                                "tokenizer": self.tokenizer.spec()}
        if self._train is not None:
            info["train"] = self._train.describe()
        info["validation"] = self.eval_tokens().describe()
        info["hash"] = (self._train.tokens_sha256 if self._train is not None else info["validation"]["tokens_sha256"])
        info["documents"] = "concatenated, each followed by EOS, cut into non-overlapping chunks"
        return info
