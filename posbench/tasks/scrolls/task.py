"""SCROLLS: fine-tune on each data set, generate answers for its validation split, score with the official
metric; the SCROLLS score is the mean of the seven data-set scores.

Data (``posbench.tasks.scrolls.data``): ``--data DIR`` with ``DIR/<dataset>/{train,validation}.jsonl`` or,
with a network, the hub's ``tau/scrolls``; duplicate ids merged into a list of references; query tasks
split at the first blank line. ``--datasets a,b`` picks a subset (default ``all``: all seven, or, from a local
``--data DIR`` that holds only some of them, those it holds; one line names the others, and the result records
them as ``data.datasets_missing``: the SCROLLS score of fewer than seven is marked incomplete).

Per data set, as in the TAPE paper: the model from ``--init RUN_DIR`` (or a fresh one) is fine-tuned for
``train.steps`` steps (``--steps``) on the train split with the loss on the answer tokens and EOS only, as one
training phase of the run (checkpointed and resumed like any training; a finished data set's outcome is kept and
its checkpoint removed), then generates greedily (KV cache, stop at EOS, at most the data set's token limit) for every
validation example. Prompts follow lm-evaluation-harness: ``{document}\\n\\nQuestion: {question}\\nAnswer:``
(ContractNLI: ``Hypothesis:`` / ``Conclusion:``; summaries ask "What is a summary of the preceding
text?"); the answer follows after one space. Only the document is truncated, to keep the prompt within
``task.max_input_tokens`` (0: ``model.max_seq_len``), from the side ``task.truncation_side`` names
(``end``: keep the beginning, as TAPE does; ``start``: keep the end). Both are recorded.

Metrics (``posbench.tasks.scrolls.metric.scrolls``): Qasper and NarrativeQA F1, QuALITY and ContractNLI EM, QMSum,
SummScreenFD and GovReport the geometric mean of ROUGE-1/2/L, all x100, in the paper's Table 1 column order,
then ``scrolls_score``. Each data set's predictions are also written as ``scrolls/<dataset>.json``
(``{id: prediction}``), the official submission format that ``posbench score`` reads.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from posbench.tasks.scrolls import data as sd
from posbench.data.batch import IGNORE_INDEX, Batch, next_token_pair
from posbench.data.errors import DataError
from posbench.errors import ConfigError
from posbench.evaluation.metrics import register_metric
from posbench.evaluation.outcome import Evaluation, Metric, mean_stderr
from posbench.files import atomic_write_json
from posbench.tasks.scrolls.metric import (COLUMN, DATASET_TO_METRICS, TABLE1, exact_match, scrolls as scrolls_metric,
                                           scrolls_score, token_f1)
from posbench.options import OneOf, Option, at_least
from posbench.tasks.corpus_task import TokenizerMixin
from posbench.tasks.base import Phase, SeededStream, Task, config_hash
from posbench.train import distributed

# generation limits in subword tokens (TAPE: 200 for QA/NLI, 1000 for summaries); x4 for byte tokenizers
GEN_TOKENS = {"gov_report": 1024, "summ_screen_fd": 512, "qmsum": 512, "narrative_qa": 64, "qasper": 128,
              "quality": 128, "contract_nli": 8}
BYTES_PER_TOKEN = 4


SCORES = {"rouge": "the geometric mean of ROUGE-1, -2 and -L", "f1": "token F1", "exact_match": "exact match"}
for _dataset, _column in TABLE1:
    register_metric("scrolls", _column, better="higher", per_example=True,
                    description=f"{_dataset}: the official SCROLLS score, "
                                f"{SCORES[DATASET_TO_METRICS[_dataset]['metric']]} x100")
register_metric("scrolls", "scrolls_score", better="higher", per_example=True,
                description="the SCROLLS score: the mean of the data sets' scores (incomplete without all seven)")


class ExampleStream(SeededStream):
    """Fine-tuning batches: examples drawn uniformly (seeded by batch index), right-padded."""

    def __init__(self, seed: int, rows: list[tuple[list[int], list[int]]], pad_id: int):
        super().__init__(seed)
        self.rows, self.pad_id = rows, pad_id

    def make_batch(self, rng: np.random.Generator, batch_size: int, index: int) -> Batch:
        picks = rng.choice(len(self.rows), size=batch_size, replace=len(self.rows) < batch_size)
        seqs = [(self.rows[i][0], self.rows[i][1]) for i in picks]
        n = max(len(p) + len(a) for p, a in seqs) - 1
        tokens = torch.full((batch_size, n), self.pad_id, dtype=torch.long)
        targets = torch.full((batch_size, n), IGNORE_INDEX, dtype=torch.long)
        for row, (prompt, answer) in enumerate(seqs):
            x, y = next_token_pair(prompt + answer, loss_from=len(prompt))
            tokens[row, :len(x)], targets[row, :len(y)] = x, y
        return Batch(tokens, targets)


class Scrolls(TokenizerMixin, Task):
    name = "scrolls"
    example_scorer = "posbench.tasks.scrolls.example_scores"
    description = "SCROLLS: per-dataset fine-tuning, greedy generation, official metrics (paper Table 1)"
    OPTIONS = {
        "datasets": Option("all", "comma-separated subset of the seven data sets, or all (from a --data folder: "
                                  "those it holds)"),
        "data": Option("", "DIR with DIR/<dataset>/{train,validation}.jsonl (empty: the hub's tau/scrolls)"),
        "tokenizer": Option("byte", "byte or a Hugging Face name/path (with --init: the init run's tokenizer)"),
        "max_input_tokens": Option(0, "longest prompt in tokens; the document is truncated to fit (0: "
                                   "model.max_seq_len)", at_least(0)),
        "truncation_side": Option("end", "end (keep the document's beginning) or start (keep its end)",
                                  OneOf(("end", "start"))),
        "max_new_tokens": Option("", "generation limit: N for all data sets, or dataset=N,... (default: per-dataset "
                                 "table)"),
        "max_train_examples": Option(0, "train examples per data set (0: all)", at_least(0)),
        "max_eval_examples": Option(0, "validation examples per data set (0: all)", at_least(0)),
        "eval_batch_size": Option(8, "prompts of equal length decoded together", at_least(1), changes_results=False),
    }

    # ---- configuration ---------------------------------------------------------------------------------
    def __init__(self, config):
        super().__init__(config)
        self.datasets = sd.parse_datasets(self.opts["datasets"])
        self.missing: list[str] = []            # all seven asked for, but the --data folder lacks these
        self._hashes: dict[str, str] = {}

    def validate(self) -> None:
        where = sd.resolve_data(self.data_arg)
        if str(self.opts["datasets"]).strip() == "all" and where.kind == "local":
            present = [d for d in sd.DATASETS if where.holds(d)]
            if not present:
                raise DataError(f"{where.root} holds none of the SCROLLS data sets ({', '.join(sd.DATASETS)}); "
                                f"{sd.WHAT_TO_PASS}")
            self.datasets, self.missing = present, [d for d in sd.DATASETS if d not in present]
            if self.missing:
                self._say(f"note: {where.root} holds {len(present)} of the 7 SCROLLS data sets: running "
                          f"{', '.join(present)}; not there: {', '.join(self.missing)} (the SCROLLS score of fewer "
                          f"than 7 is incomplete)")
        where.check(self.datasets)                             # every file is there before anything runs
        self.gen_limits = self._gen_limits()
        if self.max_input_tokens < 8:
            raise ConfigError(f"task.max_input_tokens must be >= 8, got {self.max_input_tokens}")

    @staticmethod
    def _say(line: str) -> None:
        """One line on stderr, from the main process only."""
        if distributed.current().is_main:
            print(line, file=sys.stderr)

    def _resolve_tokenizer(self):
        if self.source is None and self.opts["tokenizer"].startswith("bpe"):
            raise ConfigError("scrolls trains no tokenizer; use --tokenizer byte, a Hugging Face tokenizer, or "
                              "--init a pretrain run (its tokenizer is used)")
        return super()._resolve_tokenizer()

    def _gen_limits(self) -> dict[str, int]:
        scale = BYTES_PER_TOKEN if self.tokenizer.kind == "byte" else 1
        limits = {d: GEN_TOKENS[d] * scale for d in sd.DATASETS}
        spec = self.opts["max_new_tokens"].strip()
        if spec:
            try:
                if "=" not in spec:
                    limits = dict.fromkeys(limits, int(spec))
                else:
                    for part in spec.split(","):
                        name, _, value = part.partition("=")
                        if name.strip() not in limits:
                            raise DataError(f"task.max_new_tokens: unknown data set '{name.strip()}'")
                        limits[name.strip()] = int(value)
            except ValueError:
                raise ConfigError(f"task.max_new_tokens must be N or dataset=N,..., got {spec!r}") from None
        if any(v < 1 for v in limits.values()):
            raise ConfigError("task.max_new_tokens must be positive")
        return limits

    @property
    def max_input_tokens(self) -> int:
        return int(self.opts["max_input_tokens"] or self.config.model.get("max_seq_len") or 0)

    @property
    def data_arg(self):
        return self.opts["data"] or None

    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def seeds(self) -> dict[str, int]:
        return {"data": self.config.seed, "finetune": self.config.seed}

    def data_info(self) -> dict[str, Any]:
        info = {"source": sd.source_description(self.data_arg), "datasets": self.datasets,
                **({"datasets_missing": self.missing} if self.missing else {}),
                "splits": {"train": "train", "eval": "validation"},
                "max_input_tokens": self.max_input_tokens, "truncation_side": self.opts["truncation_side"],
                "truncated_part": "document only (the question and the prompt suffix are kept)",
                "max_new_tokens": {d: self.gen_limits[d] for d in self.datasets},
                "tokenizer": self.tokenizer.spec()}
        hashes = self._hashes
        info["dataset_hashes"] = hashes
        info["hash"] = config_hash(hashes) if hashes else config_hash(info["source"])
        return info

    # ---- data ------------------------------------------------------------------------------------------
    def encode_prompt(self, dataset: str, ex: sd.Example) -> tuple[list[int], bool]:
        doc, suffix = sd.prompt_parts(dataset, ex)
        suffix_ids = self.tokenizer.encode(suffix)
        budget = max(0, self.max_input_tokens - len(suffix_ids))
        keep_chars = budget * 16                       # no token spans more than 16 characters in practice
        end = self.opts["truncation_side"] == "end"
        char_cut = len(doc) > keep_chars
        if char_cut:
            doc = doc[:keep_chars] if end else doc[-keep_chars:]
        doc_ids = self.tokenizer.encode(doc)
        truncated = char_cut or len(doc_ids) > budget
        if len(doc_ids) > budget:
            doc_ids = doc_ids[:budget] if end else doc_ids[len(doc_ids) - budget:]
        return doc_ids + suffix_ids, truncated

    def _load(self, dataset: str, split: str) -> list[sd.Example]:
        limit = self.opts["max_train_examples" if split == "train" else "max_eval_examples"]
        # streamed, stopping at the budget; documents kept up to the characters encode_prompt can use
        examples = sd.load_split(dataset, split, self.data_arg, limit=limit, doc_chars=self.max_input_tokens * 16,
                                 doc_side=self.opts["truncation_side"])
        if not examples:
            raise DataError(f"SCROLLS {dataset}/{split} has no examples")
        digest = sd.split_digest(examples)
        self._hashes = {**self._hashes, f"{dataset}/{split}": digest}
        return examples

    # ---- fine-tuning and evaluation, one phase per data set ----------------------------------------------
    def phases(self) -> list[Phase]:
        train = self.config.training
        seed = self.config.seed * 1000
        return [Phase(dataset, lambda d=dataset, i=i: self._stream(d, seed + i), train, from_start=True,
                      seed=seed + i, evaluate=lambda model, device, reporter, d=dataset:
                      self._evaluate_dataset(model, device, reporter, d))
                for i, dataset in enumerate(self.datasets)]

    def _stream(self, dataset: str, seed: int) -> ExampleStream:
        """The fine-tuning examples of one data set (prompt, then the answer and EOS, loss on the answer)."""
        tok, limit = self.tokenizer, self.gen_limits[dataset]
        rows = []
        for ex in self._load(dataset, "train"):
            prompt, _ = self.encode_prompt(dataset, ex)
            for out in ex.outputs or [""]:
                rows.append((prompt, tok.encode(" " + out)[:limit] + [tok.eos_id]))
        return ExampleStream(seed, rows, tok.pad_id)

    def _evaluate_dataset(self, model, device, reporter, dataset: str) -> dict[str, Any]:
        examples = self._load(dataset, "validation")
        preds, n_truncated = self._generate(model, device, dataset, examples, reporter)
        refs = [ex.outputs for ex in examples]
        official = scrolls_metric(dataset, preds, refs)
        self._write_submission(dataset, {ex.id: p for ex, p in zip(examples, preds)})
        return {"official": official, "stderr": self._stderr(dataset, preds, refs), "n_eval": len(examples),
                "eval_prompts_truncated": n_truncated, "max_new_tokens": self.gen_limits[dataset],
                "hashes": {k: v for k, v in self._hashes.items() if k.startswith(f"{dataset}/")},
                "predictions": [{"dataset": dataset, "id": ex.id, "prediction": p, "references": ex.outputs}
                                for ex, p in zip(examples, preds)]}

    def evaluate(self, model, device, reporter: Any, phases: dict) -> Evaluation:
        metrics: dict[str, Metric] = {}
        per_dataset: dict[str, Any] = {}
        predictions: list[dict[str, Any]] = []
        for dataset in self.datasets:
            outcome = phases[dataset]
            result = outcome["evaluation"]
            official = result["official"]
            metrics[COLUMN[dataset]] = Metric(official["scrolls_score"], result["stderr"], result["n_eval"])
            per_dataset[dataset] = {"official": official, "n_eval": result["n_eval"],
                                    "eval_prompts_truncated": result["eval_prompts_truncated"],
                                    "max_new_tokens": result["max_new_tokens"], "finetune": outcome["training"]}
            predictions += result["predictions"]
            self._hashes = {**self._hashes, **result.get("hashes", {})}
        score = scrolls_score({d: metrics[COLUMN[d]].value for d in self.datasets})
        metrics["scrolls_score"] = Metric(score["value"], None, sum(m.n for m in metrics.values()))
        columns = [COLUMN[d] for d, _ in TABLE1 if d in self.datasets] + ["scrolls_score"]
        metrics = {c: metrics[c] for c in columns}
        return Evaluation(metrics=metrics, primary="scrolls_score", predictions=predictions,
                          info={"table_columns": columns, "table_layout": "TAPE paper Table 1",
                                "scrolls_score": score, "per_dataset": per_dataset,
                                "decoding": "greedy, KV cache, stop at EOS",
                                "prompt_format": "lm-evaluation-harness SCROLLS prompts; answer after one space",
                                "finetune_recipe": {**self.config.train, "per_dataset": True,
                                                    "loss": "answer tokens and EOS only"}})

    @staticmethod
    def _stderr(dataset: str, preds: list[str], refs: list[list[str]]) -> float | None:
        kind = DATASET_TO_METRICS[dataset]["metric"]
        if kind == "rouge":
            return None                    # a geometric mean of corpus means: no closed form
        fn = token_f1 if kind == "f1" else exact_match
        return mean_stderr([100 * max(fn(p, r) for r in rs) for p, rs in zip(preds, refs)])

    @torch.no_grad()
    def _generate(self, model, device, dataset: str, examples, reporter) -> tuple[list[str], int]:
        tok = self.tokenizer
        encoded = [self.encode_prompt(dataset, ex) for ex in examples]
        n_truncated = sum(t for _, t in encoded)
        order = sorted(range(len(examples)), key=lambda i: len(encoded[i][0]))
        preds: list[str] = [""] * len(examples)
        limit, bs = self.gen_limits[dataset], self.opts["eval_batch_size"]
        bar = reporter.task(f"generate {dataset}", total=len(examples), unit="example") if reporter else None
        done, i = 0, 0
        while i < len(order):                       # batches of equal-length prompts
            length = len(encoded[order[i]][0])
            group = [order[i]]
            while i + len(group) < len(order) and len(group) < bs and len(encoded[order[i + len(group)]][0]) == length:
                group.append(order[i + len(group)])
            prompt = torch.tensor([encoded[j][0] for j in group], device=device)
            out = model.generate(prompt, max_new_tokens=limit, eos_id=tok.eos_id).tolist()
            for j, ids in zip(group, out):
                ids = ids[: ids.index(tok.eos_id)] if tok.eos_id in ids else ids
                preds[j] = tok.decode(ids).strip()
            i += len(group)
            done += len(group)
            if bar:
                bar.update(done)
        if bar:
            bar.close()
        return preds, n_truncated

    def _write_submission(self, dataset: str, preds: dict[str, str]) -> None:
        if self.run_dir is not None:
            atomic_write_json(self.run_dir / "scrolls" / f"{dataset}.json", preds)
