"""``ruler``: RULER's retrieval tasks (Hsieh et al., 2024) beyond passkey, on a length x depth grid.

The kinds (``task.kinds``; ``posbench.tasks.ruler`` generates them offline, token-exactly, from a seed):
needle-in-a-haystack with one key (``niah_single_1..3``), several keys of which one is asked
(``niah_multikey_1..3``), several values of one key (``niah_multivalue``), several keys asked at once
(``niah_multiquery``), and variable tracking (``vt``: chains of ``VAR X = Y`` assignments; name every variable
bound to a value). Prompts are RULER's templates, ending with its answer prefix; the haystack is RULER's noise,
its distractor needles, or lines of posbench's built-in corpus where RULER uses essays.

Training (from scratch, or from ``--init``): prompts of exactly ``task.train_length`` tokens (0:
``model.max_seq_len``) holding the answer and EOS, the kinds in turn, needles at RULER's random places; the loss
on the answer and EOS (``task.loss=answer``) or on every token (``all``). Evaluation: for every kind, length
(``length_factors`` x the training length, up to 8x) and depth (where the answer-bearing needles sit, 0 = right
after the instructions, 1 = right before the question), ``trials`` examples with fixed seeds (the same for every
encoding, never trained on), greedy decoding, RULER's ``string_match_all`` (the share of expected values found
in the answer, x100). Per-example rows (keyed ``kind|length|depth|trial``) let ``compare --against`` pair
encodings example by example; each kind's length x depth grid is a heatmap in ``compare --plots``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from posbench.data.batch import IGNORE_INDEX, Batch, next_token_pair
from posbench.errors import ConfigError
from posbench.tasks.ruler.examples import data_spec, eval_seed, make_example, train_seed
from posbench.tasks.ruler.kinds import KINDS, defaults
from posbench.tasks.ruler.scoring import prediction_record
from posbench.tasks.ruler.training import training_sequence
from posbench.evaluation.metrics import register_metric
from posbench.evaluation.outcome import Axis, Evaluation, Grid, Metric, length_factor
from posbench.options import Each, OneOf, Option, at_least, between, positive
from posbench.tasks.corpus_task import TokenizerMixin
from posbench.tasks.base import SeededStream, Task, config_hash
from posbench.train import distributed

ANSWER_MARGIN = 8          # tokens decoded beyond the answer's own length (string matching ignores the rest)


class RulerStream(SeededStream):
    """Training prompts at a fixed length; row r of batch k is kind (k x B + r) mod K, drawn from its own seed."""

    def __init__(self, seed: int, kinds: list[str], tokenizer, length: int, loss: str, params: dict[str, Any]):
        super().__init__(seed)
        self.kinds, self.tok, self.length, self.loss, self.params = kinds, tokenizer, length, loss, params

    def make_batch(self, rng: np.random.Generator, batch_size: int, index: int) -> Batch:
        tokens = torch.full((batch_size, self.length), self.tok.pad_id, dtype=torch.long)
        targets = torch.full((batch_size, self.length), IGNORE_INDEX, dtype=torch.long)
        for row in range(batch_size):
            kind = self.kinds[(index * batch_size + row) % len(self.kinds)]
            ids, loss_from = training_sequence(kind, self.tok, self.length,
                                                     train_seed(self.seed, index, row),
                                                     **kind_params(kind, self.params))
            tokens[row], targets[row] = next_token_pair(ids, loss_from if self.loss == "answer" else 0)
        return Batch(tokens, targets)


def kind_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The task's parameters that this kind takes (variable tracking's chains, hops and solved example)."""
    return {k: v for k, v in params.items() if k in defaults(kind)}


register_metric("ruler", "ruler", better="higher", per_example=True,
                description="RULER score (string_match_all x100), the mean over every example")
register_metric("ruler", "ruler_{n}x", better="higher", per_example=True,
                description="RULER score (string_match_all x100) at n x the training length, every kind")
for _kind in KINDS:
    register_metric("ruler", _kind, better="higher", per_example=True,
                    description=f"RULER score (string_match_all x100) of the {_kind} examples")


class Ruler(TokenizerMixin, Task):
    name = "ruler"
    example_scorer = "posbench.tasks.ruler.example_scores"
    description = "RULER retrieval: multi-key/value/query needles and variable tracking on a length x depth grid"
    OPTIONS = {
        "kinds": Option(["niah_single_1", "niah_multikey_1", "niah_multivalue", "niah_multiquery", "vt"],
                        "RULER kinds: niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery, vt",
                        Each(OneOf(tuple(KINDS)))),
        "tokenizer": Option("byte", "byte, or a Hugging Face tokenizer name/path (with --init: the init model's)"),
        "train_length": Option(0, "training prompt length in tokens, answer included (0: model.max_seq_len)",
                               at_least(0)),
        "loss": Option("answer", "answer (the answer and EOS only) or all (every token)", OneOf(("answer", "all"))),
        "length_factors": Option([1, 2, 4, 8], "evaluation lengths as multiples of the training length",
                                 Each(positive())),
        "depths": Option([0.0, 0.25, 0.5, 0.75, 1.0], "evaluation depths in [0, 1]: where the needles holding the "
                         "answer sit", Each(between(0, 1))),
        "trials": Option(10, "examples per kind, length and depth (the same for every encoding)", at_least(1)),
        "eval_seed": Option(0, "seed of the evaluation examples", at_least(0)),
        "eval_batch_size": Option(8, "prompts decoded together", at_least(1), changes_results=False),
        "num_chains": Option(1, "vt: chains of assignments (one is asked)", at_least(1)),
        "num_hops": Option(4, "vt: assignments after the value in each chain", at_least(1)),
        "add_fewshot": Option(True, "vt: RULER's solved example before the question (needs ~700 more tokens of "
                                    "context)"),
    }

    # ---- configuration ---------------------------------------------------------------------------------
    follows = {"model.max_seq_len": "task.train_length"}

    @classmethod
    def adjust(cls, sections, source) -> None:
        """``task.train_length`` (when set) is the model's training length."""
        if sections["task"]["train_length"] > 0:
            sections["model"]["max_seq_len"] = int(sections["task"]["train_length"])

    @property
    def train_length(self) -> int:
        return int(self.config.model.get("max_seq_len") or 0)

    @property
    def params(self) -> dict[str, Any]:
        return {"num_chains": self.opts["num_chains"], "num_hops": self.opts["num_hops"],
                "add_fewshot": self.opts["add_fewshot"]}

    def validate(self) -> None:
        if self.train_length < 2:
            raise ConfigError("ruler needs a training length: set task.train_length (or model.max_seq_len)")
        for kind in self.opts["kinds"]:        # a prompt too short for a kind: RULER's one-line error, now
            make_example(kind, self.tokenizer, self.train_length, 0.5, 0, answer_room=True,
                               **kind_params(kind, self.params))

    def _resolve_tokenizer(self):
        if self.source is None and self.opts["tokenizer"].startswith("bpe"):
            raise ConfigError("ruler trains no tokenizer; use --tokenizer byte, a Hugging Face tokenizer, or --init "
                              "a pretrain run (its tokenizer is used)")
        return super()._resolve_tokenizer()

    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @classmethod
    def encoding_context(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The longest evaluation as a multiple of the training length (RandPE's span covers it)."""
        return {"eval_length_factor": float(max(options["length_factors"]))}

    def lengths(self) -> list[int]:
        return sorted({int(round(f * self.train_length)) for f in self.opts["length_factors"]})

    def train_stream(self) -> RulerStream:
        return RulerStream(self.config.seed, list(self.opts["kinds"]), self.tokenizer, self.train_length,
                           self.opts["loss"], self.params)

    def seeds(self) -> dict[str, int]:
        return {"data": self.config.seed, "eval": self.opts["eval_seed"]}

    def data_info(self) -> dict[str, Any]:
        kinds = {kind: data_spec(kind, **kind_params(kind, self.params)) for kind in self.opts["kinds"]}
        spec = {"kinds": kinds, "train_length": self.train_length, "loss": self.opts["loss"],
                "eval_seed": self.opts["eval_seed"], "trials": self.opts["trials"], "depths": self.opts["depths"]}
        return {"source": "synthetic (RULER, generated offline)", "hash": config_hash(spec), **spec,
                "tokenizer": self.tokenizer.spec()}

    # ---- evaluation ------------------------------------------------------------------------------------
    def examples(self, kind: str, length: int) -> list[tuple[int, float, int, Any]]:
        """``(depth index, depth, trial, example)`` of one kind at one length, in a fixed order."""
        out = []
        for di, depth in enumerate(self.opts["depths"]):
            for trial in range(self.opts["trials"]):
                seed = eval_seed(self.opts["eval_seed"], kind, length, di, trial)
                out.append((di, depth, trial, make_example(kind, self.tokenizer, length, depth, seed,
                                                                 **kind_params(kind, self.params))))
        return out

    def decode(self, model, device, items: list[tuple[int, float, int, Any]]) -> list[str]:
        """Greedy answers of equally long prompts, as text, up to each one's EOS."""
        tok = self.tokenizer
        prompts = torch.tensor([ex.prompt_ids for _, _, _, ex in items], device=device)
        new = max(len(ex.answer_ids) for _, _, _, ex in items) + ANSWER_MARGIN
        out = model.generate(prompts, max_new_tokens=new, eos_id=tok.eos_id).tolist()
        return [tok.decode(row[: row.index(tok.eos_id)] if tok.eos_id in row else row) for row in out]

    def evaluate(self, model, device, reporter: Any, phases: dict) -> Evaluation:
        kinds, lengths, depths = list(self.opts["kinds"]), self.lengths(), list(self.opts["depths"])
        size = self.opts["eval_batch_size"]
        rows: list[dict[str, Any]] = []
        bar = reporter.task("eval", total=len(kinds) * len(lengths), unit="cell row")
        done = 0
        for kind in kinds:
            for length in lengths:
                items = self.examples(kind, length)
                chunks = [items[i:i + size] for i in range(0, len(items), size)]
                decoded = distributed.shard_map(lambda chunk: self.decode(model, device, chunk), chunks)
                for chunk, texts in zip(chunks, decoded):
                    for (di, depth, trial, ex), text in zip(chunk, texts):
                        rows.append(prediction_record(ex, text, trial))
                done += 1
                bar.update(done, kind=kind, length=length)
        bar.close()
        return self.summarise(rows, kinds, lengths, depths)

    def summarise(self, rows: list[dict[str, Any]], kinds: list[str], lengths: list[int],
                  depths: list[float]) -> Evaluation:
        """Scores x100: a length x depth grid per kind; per kind, per length factor and overall means."""
        cells: dict[tuple[str, int, float], list[float]] = defaultdict(list)
        for row in rows:
            cells[(row["kind"], row["length"], float(row["depth"]))].append(100.0 * row["score"])
        grids, metrics = {}, {}
        for kind in kinds:
            table = [[cells[(kind, L, float(d))] for d in depths] for L in lengths]
            grids[kind] = Grid(metric="score", axes=[Axis("length", lengths), Axis("depth", depths)],
                               values=[[mean(c) for c in line] for line in table],
                               stderr=[[stderr(c) for c in line] for line in table],
                               n=[[len(c) for c in line] for line in table], higher_is_better=True,
                               meta={"train_max": {"length": self.train_length, "depth": 1.0}, "unit": "%",
                                     "metric": "string_match_all x100"})
            metrics[kind] = metric([s for line in table for c in line for s in c])
        for length in lengths:
            metrics[f"ruler_{length_factor(length, self.train_length)}x"] = metric(
                [s for (k, L, _), c in cells.items() if L == length for s in c])
        everything = [100.0 * row["score"] for row in rows]
        metrics = {"ruler": metric(everything), **metrics}
        return Evaluation(metrics=metrics, primary="ruler", grids=grids, predictions=rows,
                          info={"train_length": self.train_length, "lengths": lengths, "depths": depths,
                                "kinds": kinds, "trials": self.opts["trials"],
                                "metric": "RULER string_match_all x100 (share of expected values in the answer)",
                                "decoding": f"greedy, KV cache, the answer's length + {ANSWER_MARGIN} tokens, "
                                            f"stop at EOS"})


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def stderr(values: list[float]) -> float | None:
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n)


def metric(values: list[float]) -> Metric:
    return Metric(mean(values), stderr(values), len(values))
