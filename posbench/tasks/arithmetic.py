"""Multi-digit addition as McLeish et al. (2024) and the TAPE paper run it.

Data: ``A+B=C`` with both operands and the sum written least-significant digit first, then ``[EOS]``;
character tokenizer (``data/char.py``); operands have exactly i and j digits and no leading zero; every
operand-length pair (i, j) with 1 <= i, j <= ``train_digits`` is drawn equally often (bucket sampling:
example g of the stream belongs to pair g mod P). Loss only on the tokens after ``=`` (answer and EOS).

Evaluation: for every cell (i, j) of a grid of operand lengths up to ``eval_digits`` (default
2 x ``train_digits``), ``eval_samples`` fresh examples (seeded by ``eval_seed`` and the cell, so every
encoding sees the same ones), greedy decoding with the KV cache from the prompt up to ``=``; an example is
correct only if the whole answer and its EOS match exactly. Reported in percent: per-cell accuracy with its
standard error, the in-distribution average (cells with both lengths <= ``train_digits``), the
out-of-distribution average (the others) and the whole-grid average (the paper's headline number).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from posbench.errors import ConfigError
from posbench.data.char import EOS, PAD, CharTokenizer
from posbench.engine import IGNORE_INDEX, Batch
from posbench.results import Axis, Evaluation, Grid, Metric
from posbench.tasks.base import SeededStream, Task, config_hash

TOKENIZER = CharTokenizer()


# ---- examples ----------------------------------------------------------------------------------------------

def random_operand(rng: np.random.Generator, digits: int) -> int:
    """A uniform integer with exactly ``digits`` digits (0-9 allowed when ``digits == 1``)."""
    if digits == 1:
        return int(rng.integers(0, 10))
    first = int(rng.integers(1, 10))
    rest = rng.integers(0, 10, size=digits - 1)
    return int(str(first) + "".join(map(str, rest)))


def format_example(a: int, b: int) -> tuple[str, str]:
    """``(prompt, answer)`` with every number reversed: 12 + 9 -> ``("21+9=", "12")`` (21 reversed)."""
    return f"{str(a)[::-1]}+{str(b)[::-1]}=", str(a + b)[::-1]


def bucket_pairs(max_digits: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(1, max_digits + 1) for j in range(1, max_digits + 1)]


def sequence_length(max_digits: int) -> int:
    """Tokens of the longest training example: A, +, B, =, C (up to max+1 digits), EOS."""
    return 3 * max_digits + 4


def encode_examples(pairs: list[tuple[int, int]], length: int) -> Batch:
    """Training tensors: inputs ``ids[:-1]``, targets ``ids[1:]`` masked up to and including ``=``,
    right-padded to ``length - 1`` with PAD (ignored in the loss)."""
    n = length - 1
    tokens = torch.full((len(pairs), n), PAD, dtype=torch.long)
    targets = torch.full((len(pairs), n), IGNORE_INDEX, dtype=torch.long)
    for row, (a, b) in enumerate(pairs):
        prompt, answer = format_example(a, b)
        ids = TOKENIZER.encode(prompt + answer, eos=True)
        if len(ids) > length:
            raise ValueError(f"example of {len(ids)} tokens exceeds the sequence length {length}")
        x, y = ids[:-1], ids[1:]
        eq = len(prompt) - 1                      # index of '=' in ids; targets from there on are answer + EOS
        tokens[row, :len(x)] = torch.tensor(x)
        targets[row, eq:len(y)] = torch.tensor(y[eq:])
    return Batch(tokens, targets)


class AdditionStream(SeededStream):
    """Bucketed training examples; batch k is a pure function of (seed, k)."""

    def __init__(self, seed: int, train_digits: int):
        super().__init__(seed)
        self.pairs = bucket_pairs(train_digits)
        self.length = sequence_length(train_digits)

    def make_batch(self, rng: np.random.Generator, batch_size: int, index: int) -> Batch:
        start = index * batch_size
        operands = []
        for g in range(start, start + batch_size):
            i, j = self.pairs[g % len(self.pairs)]
            operands.append((random_operand(rng, i), random_operand(rng, j)))
        return encode_examples(operands, self.length)


# ---- scoring -----------------------------------------------------------------------------------------------

def exact_match(predicted: list[int], target: list[int], eos_id: int = EOS) -> bool:
    """True if ``predicted`` up to and including its first EOS equals ``target`` (which ends with EOS)."""
    cut = predicted.index(eos_id) + 1 if eos_id in predicted else len(predicted)
    return list(predicted[:cut]) == list(target)


def cell_stderr(accuracy: float, n: int) -> float | None:
    """Standard error of a proportion with the sample standard deviation (lm-eval's closed form)."""
    if n < 2:
        return None
    return math.sqrt(accuracy * (1 - accuracy) / (n - 1))


def summarise(grid: dict[tuple[int, int], tuple[int, int]], train_digits: int) -> dict[str, Metric]:
    """``{(i, j): (correct, n)}`` -> whole-grid, in-distribution and out-of-distribution averages (percent)
    as unweighted means of the cells, with standard errors of those means."""
    groups: dict[str, list[tuple[float, float | None, int]]] = {"accuracy": [], "accuracy_id": [],
                                                                "accuracy_ood": []}
    for (i, j), (correct, n) in grid.items():
        acc = correct / n
        cell = (acc, cell_stderr(acc, n), n)
        groups["accuracy"].append(cell)
        groups["accuracy_id" if i <= train_digits and j <= train_digits else "accuracy_ood"].append(cell)
    metrics = {}
    for name, cells in groups.items():
        if not cells:
            metrics[name] = Metric(None, None, 0, True)
            continue
        value = 100 * sum(c[0] for c in cells) / len(cells)
        if all(c[1] is not None for c in cells):
            stderr = 100 * math.sqrt(sum(c[1] ** 2 for c in cells)) / len(cells)
        else:
            stderr = None
        metrics[name] = Metric(value, stderr, sum(c[2] for c in cells), True)
    return metrics


# ---- the task ----------------------------------------------------------------------------------------------

class Arithmetic(Task):
    name = "arithmetic"
    description = "addition, reversed digits (McLeish et al.); accuracy grid up to 2x the training length"
    options = {
        "train_digits": 5,
        "eval_digits": 0,
        "eval_samples": 100,
        "eval_seed": 42,
        "eval_batch_size": 1024,
    }
    option_help = {
        "train_digits": "longest operand in training (the paper: 20)",
        "eval_digits": "longest operand in the evaluation grid (0: 2 x train_digits)",
        "eval_samples": "examples per grid cell (the paper: 100)",
        "eval_seed": "seed of the evaluation examples (the same for every encoding)",
        "eval_batch_size": "prompts decoded together",
    }
    presets = {
        "tiny": {
            "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 0},
            "train": {"steps": 30, "batch_size": 32, "lr": 3e-3, "warmup_ratio": 0.1, "log_every": 10,
                      "threads": 1},
            "task": {"train_digits": 2, "eval_digits": 3, "eval_samples": 8},
        },
        "small": {
            # tuned on a 2-core CPU (benchmarks/arithmetic_small.py): RoPE and TAPE both reach >= 90% on the
            # in-distribution cells; wider models (128) learn no faster per second, lr >= 2e-3 stalls
            "model": {"d_model": 64, "n_layers": 4, "n_heads": 4, "max_seq_len": 0},
            "train": {"steps": 4000, "batch_size": 64, "lr": 1e-3, "warmup_ratio": 0.05, "log_every": 250},
            "task": {"train_digits": 5, "eval_samples": 100},
        },
        "paper": {
            # TAPE Table 5 / zhuconv/arithmetic: 16 layers, width 1024, 16 heads, GLU width 1024 after gating,
            # sequence length 64 for 20-digit operands, batch 512 (2 x 256), 20k steps, AdamW lr 1e-4.
            "model": {"d_model": 1024, "n_layers": 16, "n_heads": 16, "d_ff": 1024, "max_seq_len": 0},
            "train": {"steps": 20000, "batch_size": 512, "grad_accum": 2, "lr": 1e-4, "log_every": 200,
                      "checkpoint_every": 2000},
            "task": {"train_digits": 20, "eval_digits": 40, "eval_samples": 100},
        },
    }

    def validate(self) -> None:
        t, e = self.opts["train_digits"], self.eval_digits
        if t < 1:
            raise ConfigError(f"task.train_digits must be >= 1, got {t}")
        if e < 1:
            raise ConfigError(f"task.eval_digits must be >= 1, got {e}")
        for key in ("eval_samples", "eval_batch_size"):
            if self.opts[key] < 1:
                raise ConfigError(f"task.{key} must be >= 1, got {self.opts[key]}")

    @property
    def eval_digits(self) -> int:
        return self.opts["eval_digits"] or 2 * self.opts["train_digits"]

    def vocab_size(self) -> int:
        return TOKENIZER.vocab_size

    def model_config(self):
        cfg = super().model_config()
        if cfg.max_seq_len == 0:
            cfg.max_seq_len = sequence_length(self.opts["train_digits"])
        return cfg

    def train_stream(self) -> AdditionStream:
        return AdditionStream(self.config.seed, self.opts["train_digits"])

    def seeds(self) -> dict[str, int]:
        return {"data": self.config.seed, "eval": self.opts["eval_seed"]}

    def data_info(self) -> dict[str, Any]:
        spec = {"generator": "bucketed reversed addition v1", "train_digits": self.opts["train_digits"],
                "eval_digits": self.eval_digits, "eval_samples": self.opts["eval_samples"],
                "eval_seed": self.opts["eval_seed"], "data_seed": self.config.seed}
        return {"source": "synthetic (McLeish et al. bucket method, reversed operands and sum)",
                "hash": config_hash(spec), **spec}

    # ---- evaluation ------------------------------------------------------------------------------------
    def eval_examples(self, i: int, j: int) -> list[tuple[int, int]]:
        rng = np.random.default_rng(np.random.SeedSequence([self.opts["eval_seed"], i, j]))
        return [(random_operand(rng, i), random_operand(rng, j)) for _ in range(self.opts["eval_samples"])]

    def evaluate(self, model, device: torch.device, reporter: Any) -> Evaluation:
        top, train = self.eval_digits, self.opts["train_digits"]
        cells = bucket_pairs(top)
        by_length: dict[int, list[tuple[int, int]]] = defaultdict(list)   # prompts of equal length batch
        for i, j in cells:
            by_length[i + j].append((i, j))
        counts: dict[tuple[int, int], list[int]] = {cell: [0, 0] for cell in cells}
        predictions: list[dict[str, Any]] = []
        bar = reporter.task("eval", total=len(cells), unit="cell") if reporter else None
        done = 0
        for total_len in sorted(by_length):
            group = [(cell, a, b) for cell in by_length[total_len] for a, b in self.eval_examples(*cell)]
            max_new = max(max(i, j) for (i, j), _, _ in group) + 2
            for start in range(0, len(group), self.opts["eval_batch_size"]):
                chunk = group[start:start + self.opts["eval_batch_size"]]
                texts = [format_example(a, b) for _, a, b in chunk]
                prompt = torch.tensor([TOKENIZER.encode(p) for p, _ in texts], device=device)
                out = model.generate(prompt, max_new_tokens=max_new, eos_id=EOS).tolist()
                for (cell, a, b), (p, answer), pred in zip(chunk, texts, out):
                    correct = exact_match(pred, TOKENIZER.encode(answer, eos=True))
                    counts[cell][0] += int(correct)
                    counts[cell][1] += 1
                    predictions.append({"len_a": cell[0], "len_b": cell[1], "a": str(a), "b": str(b),
                                        "prompt": p, "target": answer,
                                        "prediction": TOKENIZER.decode(_until_eos(pred)), "correct": correct})
            done += len(by_length[total_len])
            if bar:
                bar.update(done)
        if bar:
            bar.close()
        grid_counts = {cell: (c, n) for cell, (c, n) in counts.items()}
        metrics = summarise(grid_counts, train)
        lengths = list(range(1, top + 1))
        values = [[100 * counts[(i, j)][0] / counts[(i, j)][1] for j in lengths] for i in lengths]
        stderr = [[_pct(cell_stderr(counts[(i, j)][0] / counts[(i, j)][1], counts[(i, j)][1])) for j in lengths]
                  for i in lengths]
        grid = Grid(metric="accuracy", axes=[Axis("len_a", lengths), Axis("len_b", lengths)], values=values,
                    stderr=stderr, n=[[counts[(i, j)][1] for j in lengths] for i in lengths],
                    higher_is_better=True, meta={"train_max": {"len_a": train, "len_b": train}, "unit": "%"})
        return Evaluation(metrics=metrics, primary="accuracy", grids={"accuracy": grid}, predictions=predictions,
                          info={"cells": len(cells), "samples_per_cell": self.opts["eval_samples"],
                                "decoding": "greedy, KV cache"})


    @classmethod
    def example_scores(cls, result: dict[str, Any], predictions: list[dict[str, Any]]):
        """accuracy / _id / _ood as means of the per-example correctness (every grid cell has the same number
        of examples, so the mean of the cells is the mean of the examples); strata: the grid cells."""
        from posbench.stats import ExampleScores, mean_recipe

        train = int(result["config"]["task_options"]["train_digits"])
        seen: dict[tuple, int] = defaultdict(int)
        keys, cells, inside = [], [], []
        for p in predictions:
            cell = (int(p["len_a"]), int(p["len_b"]))
            ident = (*cell, str(p["a"]), str(p["b"]))
            keys.append((*ident, seen[ident]))
            seen[ident] += 1
            cells.append(cell)
            inside.append(cell[0] <= train and cell[1] <= train)
        correct = 100.0 * np.array([bool(p["correct"]) for p in predictions], dtype=float)
        inside_arr = np.array(inside, dtype=bool)
        terms = {"all": correct, "id": np.where(inside_arr, correct, np.nan),
                 "ood": np.where(inside_arr, np.nan, correct)}
        return ExampleScores(keys, cells, terms, {"accuracy": mean_recipe("all"), "accuracy_id": mean_recipe("id"),
                                                   "accuracy_ood": mean_recipe("ood")})


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS)] if EOS in ids else ids


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x
