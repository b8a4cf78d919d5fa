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

Probe (``train.probe_every``): during training, the exact-match accuracy on ``PROBE_EXAMPLES`` examples spread
evenly over the in-distribution cells, other examples than the evaluation's (drawn from ``eval_seed`` and the
cell in a stream of their own), decoded the same way; ``posbench.report.plateau`` reads its history to say
whether a run's in-distribution accuracy had stopped improving.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import cached_property
from typing import Any

import numpy as np
import torch

from posbench.data.batch import IGNORE_INDEX, Batch
from posbench.data.char import BOS, EOS, PAD, SPECIALS, UNK, CharTokenizer
from posbench.evaluation.metrics import register_metric
from posbench.evaluation.outcome import Axis, Evaluation, Grid, Metric
from posbench.options import Option, at_least
from posbench.tasks.base import IndexedStream, Task, config_hash
from posbench.train import distributed

TOKENIZER = CharTokenizer()


# ---- examples ----------------------------------------------------------------------------------------------

def random_operand(rng: np.random.Generator, digits: int) -> int:
    """A uniform integer with exactly ``digits`` digits (0-9 allowed when ``digits == 1``)."""
    if digits == 1:
        return int(rng.integers(0, 10))
    first = int(rng.integers(1, 10))
    rest = rng.integers(0, 10, size=digits - 1)
    return int(str(first) + (rest.astype(np.uint8) + 48).tobytes().decode("ascii"))


def format_example(a: int, b: int) -> tuple[str, str]:
    """``(prompt, answer)`` with every number reversed: 12 + 9 -> ``("21+9=", "12")`` (21 reversed)."""
    return f"{str(a)[::-1]}+{str(b)[::-1]}=", str(a + b)[::-1]


def bucket_pairs(max_digits: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(1, max_digits + 1) for j in range(1, max_digits + 1)]


def sequence_length(max_digits: int) -> int:
    """Tokens of the longest training example: A, +, B, =, C (up to max+1 digits), EOS."""
    return 3 * max_digits + 4


PROBE_EXAMPLES = 1000          # per probe: at 50% accuracy a standard error of 1.6 points
PROBE_STREAM = 1               # the probe's examples: SeedSequence([eval_seed, i, j, PROBE_STREAM])
Example = tuple[tuple[int, int], int, int]      # (its cell (i, j), a, b)

DIGIT0, PLUS, EQUALS = TOKENIZER.id_of("0"), TOKENIZER.id_of("+"), TOKENIZER.id_of("=")


def random_digits(rng: np.random.Generator, lengths: np.ndarray, width: int) -> np.ndarray:
    """Operands with exactly ``lengths [n, 2]`` digits, uniform (the same law as ``random_operand``), as
    digit arrays ``[n, 2, width]`` least-significant first, zero beyond each length."""
    digits = rng.integers(0, 10, size=(*lengths.shape, width), dtype=np.int8)
    lead = rng.integers(1, 10, size=lengths.shape, dtype=np.int8)
    column = np.arange(width)
    length = lengths[..., None]
    digits = np.where(column < length, digits, 0)
    top = (column == length - 1) & (length > 1)       # the leading digit of a number of 2+ digits: 1-9
    return np.where(top, lead[..., None], digits).astype(np.int8)


def encode_digits(lengths: np.ndarray, digits: np.ndarray, length: int) -> Batch:
    """Training tensors for operands given as digit arrays (``random_digits``), vectorised with NumPy: the sum
    with its carries, the reversed ``A+B=C`` + EOS layout, right-padded to ``length - 1`` with PAD, and the loss
    mask (targets from the prediction made at ``=`` to EOS). ``tests/arithmetic_oracle.py`` encodes examples one
    by one from Python integers; the tests hold this function to it."""
    n, width = len(lengths), digits.shape[-1]
    la, lb = lengths[:, 0:1].astype(np.int64), lengths[:, 1:2].astype(np.int64)
    pair_sum = digits[:, 0].astype(np.int16) + digits[:, 1]
    total = np.zeros((n, width + 1), dtype=np.int16)
    carry = np.zeros(n, dtype=np.int16)
    for k in range(width):
        column = pair_sum[:, k] + carry
        carry = column // 10
        total[:, k] = column - 10 * carry
    total[:, width] = carry
    longer = np.maximum(la, lb)
    lc = longer + np.take_along_axis(total, longer, axis=1)       # one more digit if the last carry is 1
    # one row of sources per example: [A digits | + | B digits | = | C digits | EOS | PAD], then each output
    # column picks its source by the segment it falls in
    ones = np.ones((n, 1), dtype=np.int16)
    source = np.concatenate([digits[:, 0] + DIGIT0, PLUS * ones, digits[:, 1] + DIGIT0, EQUALS * ones,
                             total + DIGIT0, EOS * ones, PAD * ones], axis=1)
    col = np.arange(length)[None, :]
    c_start = la + lb + 2                                   # the first answer digit
    eos_at = c_start + lc
    index = np.where(col < la, col, col - la + width)                                  # A, then + and B
    index = np.where(col < c_start - 1, index, col - (c_start - 1) + 2 * width + 1)    # = and C
    index = np.where(col < eos_at, index, np.where(col == eos_at, 3 * width + 3, 3 * width + 4))
    ids = np.take_along_axis(source, index, axis=1).astype(np.int64)
    if int(eos_at.max(initial=0)) >= length:
        raise ValueError(f"example of {int(eos_at.max()) + 1} tokens exceeds the sequence length {length}")
    input_col = col[:, :-1]
    tokens = np.where(input_col < eos_at, ids[:, :-1], PAD)          # EOS is predicted, never an input
    keep = (input_col >= c_start - 1) & (input_col < eos_at)       # from the prediction made at '=' to EOS
    targets = np.where(keep, ids[:, 1:], IGNORE_INDEX)
    return Batch(torch.from_numpy(tokens), torch.from_numpy(targets), target_count=int(keep.sum()))


class AdditionStream(IndexedStream):
    """Bucketed training examples: example g has operand lengths ``bucket_pairs[g mod P]`` and digits drawn
    from (seed, g // BLOCK), so it is the same whatever the batch size or the number of processes."""

    BLOCK = 256
    TAG = 0x41444421      # keeps the training draws apart from the evaluation's (eval_seed, i, j) seeds

    def __init__(self, seed: int, train_digits: int):
        super().__init__(seed)
        self.pairs = bucket_pairs(train_digits)
        self.lengths = np.array(self.pairs, dtype=np.int64)
        self.digits = train_digits
        self.length = sequence_length(train_digits)
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        if block not in self._blocks:
            if len(self._blocks) >= 4:
                self._blocks.pop(next(iter(self._blocks)))
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.TAG, block]))
            g = np.arange(block * self.BLOCK, (block + 1) * self.BLOCK)
            lengths = self.lengths[g % len(self.lengths)]
            self._blocks[block] = (lengths, random_digits(rng, lengths, self.digits))
        return self._blocks[block]

    def make_examples(self, start: int, count: int) -> Batch:
        lengths, digits = [], []
        for block in range(start // self.BLOCK, (start + count - 1) // self.BLOCK + 1):
            lo = max(start, block * self.BLOCK) - block * self.BLOCK
            hi = min(start + count, (block + 1) * self.BLOCK) - block * self.BLOCK
            block_lengths, block_digits = self._block(block)
            lengths.append(block_lengths[lo:hi])
            digits.append(block_digits[lo:hi])
        return encode_digits(np.concatenate(lengths), np.concatenate(digits), self.length)


# ---- scoring -----------------------------------------------------------------------------------------------

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
            metrics[name] = Metric(None, None, 0)
            continue
        value = 100 * sum(c[0] for c in cells) / len(cells)
        if all(c[1] is not None for c in cells):
            stderr = 100 * math.sqrt(sum(c[1] ** 2 for c in cells)) / len(cells)
        else:
            stderr = None
        metrics[name] = Metric(value, stderr, sum(c[2] for c in cells))
    return metrics


# ---- the task ----------------------------------------------------------------------------------------------

register_metric("arithmetic", "accuracy", better="higher", per_example=True,
                description="exact-match accuracy (%), the mean of every grid cell's")
register_metric("arithmetic", "accuracy_id", better="higher", per_example=True,
                description="exact-match accuracy (%) of the cells with both operands no longer than in training")
register_metric("arithmetic", "accuracy_ood", better="higher", per_example=True,
                description="exact-match accuracy (%) of the cells with an operand longer than in training")


class Arithmetic(Task):
    name = "arithmetic"
    example_scorer = "posbench.tasks.arithmetic.example_scores"
    description = "addition, reversed digits (McLeish et al.); accuracy grid up to 2x the training length"
    OPTIONS = {
        "train_digits": Option(5, "longest operand in training (the paper: 20)", at_least(1)),
        "eval_digits": Option(0, "longest operand in the evaluation grid (0: 2 x train_digits)", at_least(0)),
        "eval_samples": Option(100, "examples per grid cell (the paper: 100)", at_least(1)),
        "eval_seed": Option(42, "seed of the evaluation examples (the same for every encoding)", at_least(0)),
        "eval_batch_size": Option(1024, "prompts decoded together", at_least(1), changes_results=False),
    }

    @classmethod
    def encoding_context(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The character tokenizer's ids of the digits 0-9 (Abacus embeddings count them); the longest number in
        training and at evaluation (the sums: one digit more than the operands), which Abacus's offset range
        covers; and the longest evaluated sequence over the training one (RandPE's sampling range covers it)."""
        train = options["train_digits"]
        evaluation = options["eval_digits"] or 2 * train
        return {"digit_ids": [TOKENIZER.id_of(str(d)) for d in range(10)],
                "number_digits": [train + 1, evaluation + 1],
                "eval_length_factor": sequence_length(evaluation) / sequence_length(train)}

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
        # v2: training examples drawn per block of 256 examples (the same law; other examples per seed than v1,
        # which drew per batch); the evaluation examples are unchanged
        spec = {"generator": "bucketed reversed addition v2", "train_digits": self.opts["train_digits"],
                "eval_digits": self.eval_digits, "eval_samples": self.opts["eval_samples"],
                "eval_seed": self.opts["eval_seed"], "data_seed": self.config.seed}
        return {"source": "synthetic (McLeish et al. bucket method, reversed operands and sum)",
                "hash": config_hash(spec), **spec}

    # ---- evaluation ------------------------------------------------------------------------------------
    def eval_examples(self, i: int, j: int, count: int | None = None, *stream: int) -> list[tuple[int, int]]:
        """``count`` (default ``eval_samples``) examples of cell (i, j), the same for every encoding; ``stream``:
        another sequence of examples (the probe's)."""
        rng = np.random.default_rng(np.random.SeedSequence([self.opts["eval_seed"], i, j, *stream]))
        return [(random_operand(rng, i), random_operand(rng, j))
                for _ in range(self.opts["eval_samples"] if count is None else count)]

    def eval_batches(self) -> list[list[Example]]:
        """The evaluation examples ``(cell, a, b)`` in decoding batches: prompts of equal length (cells with
        the same i + j) together, at most ``eval_batch_size`` per batch."""
        cells = bucket_pairs(self.eval_digits)
        return self.batches({cell: self.eval_examples(*cell) for cell in cells})

    @cached_property
    def probe_batches(self) -> list[list[Example]]:
        """The probe's examples: ``PROBE_EXAMPLES`` (rounded up to a whole number per cell) over the cells with
        both lengths <= ``train_digits``, each cell equally often (so their mean is the mean of the cells)."""
        cells = bucket_pairs(self.opts["train_digits"])
        per_cell = -(-PROBE_EXAMPLES // len(cells))
        return self.batches({cell: self.eval_examples(*cell, per_cell, PROBE_STREAM) for cell in cells})

    def batches(self, examples: dict[tuple[int, int], list[tuple[int, int]]]) -> list[list[Example]]:
        by_length: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for i, j in examples:
            by_length[i + j].append((i, j))
        size = self.opts["eval_batch_size"]
        batches = []
        for total_len in sorted(by_length):
            group = [(cell, a, b) for cell in by_length[total_len] for a, b in examples[cell]]
            batches += [group[start:start + size] for start in range(0, len(group), size)]
        return batches

    def probe(self, model, device: torch.device) -> dict[str, float]:
        """In-distribution exact-match accuracy (%) on the probe's examples (see the module docstring)."""
        correct = total = 0
        for batch in self.probe_batches:
            pairs = [format_example(a, b) for _, a, b in batch]
            out = decode_batch(model, device, [p for p, _ in pairs], new_tokens(batch))
            correct += int(score_answers([answer for _, answer in pairs], out).sum())
            total += len(batch)
        return {"accuracy_id": 100 * correct / total}

    def evaluate(self, model, device: torch.device, reporter: Any, phases: dict) -> Evaluation:
        """Greedy decoding of every batch (split across torchrun's processes and gathered in order, so the
        metrics equal one process's), then exact-match scoring of whole answers, vectorised on the host."""
        top, train = self.eval_digits, self.opts["train_digits"]
        cells = bucket_pairs(top)
        batches = self.eval_batches()
        texts = [[format_example(a, b) for _, a, b in batch] for batch in batches]
        total = sum(len(batch) for batch in batches)
        bar = reporter.task("eval", total=total, unit="example") if reporter else None

        def decode(index: int) -> np.ndarray:
            return decode_batch(model, device, [p for p, _ in texts[index]], new_tokens(batches[index]))

        def progress(n_batches: int) -> None:
            if bar:
                bar.update(min(total, round(total * n_batches / max(len(batches), 1))))
        outputs = distributed.shard_map(decode, range(len(batches)),
                                        cost=lambda i: len(batches[i]) * new_tokens(batches[i]),
                                        on_done=progress)
        if bar:
            bar.close()
        counts: dict[tuple[int, int], list[int]] = {cell: [0, 0] for cell in cells}
        predictions: list[dict[str, Any]] = []
        for batch, pairs, out in zip(batches, texts, outputs):
            correct = score_answers([answer for _, answer in pairs], out)
            shown = decode_until_eos(out)
            for (cell, a, b), (p, answer), ok, pred in zip(batch, pairs, correct.tolist(), shown):
                counts[cell][0] += ok
                counts[cell][1] += 1
                predictions.append({"len_a": cell[0], "len_b": cell[1], "a": str(a), "b": str(b), "prompt": p,
                                    "target": answer, "prediction": pred, "correct": ok})
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

# ---- host-side encoding and scoring, vectorised ----------------------------------------------------------

_TO_ID = np.full(256, UNK, dtype=np.int64)
for _char, _id in TOKENIZER.to_id.items():
    _TO_ID[ord(_char)] = _id
_TO_CHAR = np.full(256, ord("?"), dtype=np.uint8)          # what TOKENIZER.decode shows, 0 = dropped
_TO_CHAR[[PAD, BOS, EOS]] = 0
for _index, _char in enumerate(TOKENIZER.chars):
    _TO_CHAR[len(SPECIALS) + _index] = ord(_char)


def new_tokens(batch: list[Example]) -> int:
    """Tokens to decode for a batch: its longest answer (max digits + 1), EOS and one more."""
    return max(max(cell) for cell, _, _ in batch) + 2


def decode_batch(model, device: torch.device, prompts: list[str], max_new_tokens: int) -> np.ndarray:
    """Greedy decoding (KV cache) of equally long prompts -> the new ids ``[n, max_new_tokens]`` on the host."""
    out = model.generate(encode_equal_length(prompts).to(device), max_new_tokens=max_new_tokens, eos_id=EOS)
    return out.to("cpu", torch.int8).numpy()                   # ids < 128: a small gather


def encode_equal_length(prompts: list[str]) -> torch.Tensor:
    """``TOKENIZER.encode`` of equally long ASCII prompts as one ``[n, L]`` tensor."""
    raw = np.frombuffer("".join(prompts).encode("ascii"), dtype=np.uint8)
    return torch.from_numpy(_TO_ID[raw].reshape(len(prompts), -1))


def score_answers(answers: list[str], predicted: np.ndarray) -> np.ndarray:
    """Exact match of every row of ``predicted [n, W]`` against ``encode(answer) + [EOS]``: the first
    ``len(answer) + 1`` ids must be the answer's digits and EOS (what follows is ignored)."""
    n, width = predicted.shape
    lengths = np.array([len(a) for a in answers], dtype=np.int64)
    if n == 0:
        return np.zeros(0, dtype=bool)
    if int(lengths.max()) + 1 > width:
        raise ValueError("predictions are shorter than the answers they are scored against")
    target = np.full((n, width), -1, dtype=np.int64)       # -1: not compared
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    target[rows, cols] = _TO_ID[np.frombuffer("".join(answers).encode("ascii"), dtype=np.uint8)]
    target[np.arange(n), lengths] = EOS
    return ((predicted.astype(np.int64) == target) | (target < 0)).all(axis=1)


def decode_until_eos(predicted: np.ndarray) -> list[str]:
    """``TOKENIZER.decode`` of every row up to its first EOS."""
    ids = predicted.astype(np.int64)
    is_eos = ids == EOS
    cut = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), ids.shape[1])
    chars = _TO_CHAR[np.clip(ids, 0, 255)]                 # ids past the vocabulary show as "?"
    return [row[:k].tobytes().replace(b"\0", b"").decode("ascii") for row, k in zip(chars, cut.tolist())]


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x
