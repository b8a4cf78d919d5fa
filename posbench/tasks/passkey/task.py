"""Passkey retrieval: find a 1-5 digit key hidden in filler text, at and beyond the training length.

Training (from ``--init RUN_DIR`` or from scratch): prompts of the LongLoRA template assembled in token
space at ``task.train_length`` tokens (0: ``model.max_seq_len``) with a uniform random depth and key,
followed by the answer and EOS; the loss is on every token (``task.loss=all``) or on the answer and EOS
only (``answer``).

Evaluation, ``task.mode``:

* ``grid`` (default): a length x depth grid -- lengths ``length_factors`` x the training length, depths
  ``depths`` (0: key right after the task description, 1: right before the question), ``trials`` keys
  per cell with fixed seeds (the same for every encoding); accuracy heatmap per encoding in ``compare``.
  A grid prompt is built as a training example is (``build_like_training``): prompt and answer together are
  the grid length, so at 1x the prompts are drawn from the training distribution (the key no farther back
  than in training) and every longer length is built the same way (task version 2; in version 1 the prompt
  alone was the grid length, so at depth 0 the key sat a few tokens farther back than any training key).
* ``longlora``: LongLoRA's ``passkey_retrivial.py`` exactly -- character-budget prompts built by
  ``posbench.evaluation.passkey.longlora_prompt`` with numpy seeds 0..trials-1 at each of the
  ``max_tokens // interval`` length points (``n_garbage = int(3.75 * (i + 1) * interval // 1024 * 1024)``
  characters), reported against the mean prompt length in tokens.

A trial is correct when greedy decoding of exactly as many tokens as the answer (``" " + key``) has
reproduces it. Chance is 1 in 49,999.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from posbench.data.batch import IGNORE_INDEX, Batch, next_token_pair
from posbench.errors import ConfigError
from posbench.evaluation import passkey as pk
from posbench.evaluation.metrics import register_metric
from posbench.evaluation.outcome import Axis, Evaluation, Grid, Metric, length_factor
from posbench.options import Bound, Each, OneOf, Option, at_least, between
from posbench.tasks.corpus_task import TokenizerMixin
from posbench.tasks.base import SeededStream, Task, config_hash
from posbench.train import distributed

MODES = ("grid", "longlora")
CHANCE = 1 / (pk.KEY_HIGH - pk.KEY_LOW)
#: the longest prompt the task builds, in tokens (2**19: five times LongLoRA's longest passkey test, 100k): a
#: length, a grid length (``train_length`` x a length factor) or ``max_tokens`` past it is refused when the
#: configuration is resolved (``--dry-run`` included), not found out by a MemoryError after training
MAX_TOKENS = 524_288
MAX_POINTS = 1024                   # longlora mode's length points (max_tokens // interval)


def _stderr(acc: float, n: int) -> float | None:
    return math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else None


def build_like_training(builder: pk.GridBuilder, length: int, depth: float, key: int) -> pk.GridPrompt:
    """A prompt whose prompt and answer together are ``length`` tokens, the key at ``depth``: how every training
    example is made, and so how every grid prompt is made (at 1x exactly the training distribution; at 2x, 4x the
    same construction, longer)."""
    answer_len = len(builder.tok.encode(pk.answer_text(key)))
    return builder.build(length - answer_len, depth, key)


def equal_length_chunks(items: list[tuple[int, float, pk.GridPrompt]], size: int) -> list[list]:
    """Batches of at most ``size`` prompts of one token length (a key's digits set its prompt's length), in the
    items' order within each length."""
    by_length: dict[int, list] = defaultdict(list)
    for item in items:
        by_length[len(item[2].prompt_ids)].append(item)
    return [group[start: start + size] for _, group in sorted(by_length.items())
            for start in range(0, len(group), size)]


class PasskeyStream(SeededStream):
    """Training prompts at a fixed length; example g draws (depth, key) from (seed, batch index)."""

    def __init__(self, seed: int, builder: pk.GridBuilder, length: int, eos_id: int, pad_id: int, loss: str):
        super().__init__(seed)
        self.builder, self.length, self.eos_id, self.pad_id, self.loss = builder, length, eos_id, pad_id, loss

    def make_batch(self, rng: np.random.Generator, batch_size: int, index: int) -> Batch:
        tokens = torch.full((batch_size, self.length), self.pad_id, dtype=torch.long)
        targets = torch.full((batch_size, self.length), IGNORE_INDEX, dtype=torch.long)
        for row in range(batch_size):
            key = int(rng.integers(pk.KEY_LOW, pk.KEY_HIGH))
            depth = float(rng.random())
            p = build_like_training(self.builder, self.length, depth, key)
            seq = p.prompt_ids + p.answer_ids + [self.eos_id]          # length + 1 tokens
            loss_from = len(p.prompt_ids) if self.loss == "answer" else 0
            tokens[row], targets[row] = next_token_pair(seq, loss_from)
        return Batch(tokens, targets)


for _name, _what in (("accuracy", "every cell of the grid (longlora mode: every length point)"),
                     ("accuracy_train_length", "the lengths up to the training length"),
                     ("accuracy_beyond", "the lengths beyond the training length"),
                     ("acc_{n}x", "the length n x the training length, every depth"),
                     ("acc_{n}", "longlora mode: the length point of n tokens on average")):
    register_metric("passkey", _name, better="higher", per_example=True,
                    description=f"passkey retrieval accuracy (%): {_what}")


class Passkey(TokenizerMixin, Task):
    name = "passkey"
    example_scorer = "posbench.tasks.passkey.example_scores"
    #: 2: a grid prompt and its answer are the grid length together, as in training (1: the prompt alone was)
    version = 2
    description = "passkey retrieval (LongLoRA template): length x depth accuracy grid, or LongLoRA's exact test"
    OPTIONS = {
        "mode": Option("grid", "grid (length x depth, token-exact lengths) or longlora (LongLoRA's script exactly)",
                       OneOf(MODES)),
        "tokenizer": Option("byte", "byte, or a Hugging Face tokenizer name/path (with --init: the init run's)"),
        "train_length": Option(0, "fine-tuning length in tokens (0: model.max_seq_len); sets model.max_seq_len",
                               between(0, MAX_TOKENS)),
        "loss": Option("all", "all (every token) or answer (the key and EOS only)", OneOf(("all", "answer"))),
        "length_factors": Option([1, 2, 4], "grid lengths as multiples of the training length",
                                 Each(Bound(low=0, high=1024, low_strict=True))),
        "depths": Option([0.0, 0.25, 0.5, 0.75, 1.0], "grid depths in [0, 1] (fraction of the filler before the key)",
                         Each(between(0.0, 1.0))),
        "trials": Option(10, "keys per grid cell / per LongLoRA length point (LongLoRA: 10, TAPE: 20)",
                         between(1, 100_000)),
        "eval_seed": Option(0, "seed of the grid's keys (the same for every encoding)", at_least(0)),
        "max_tokens": Option(0, "longlora mode: --max_tokens (0: the largest grid length)", between(0, MAX_TOKENS)),
        "interval": Option(0, "longlora mode: --interval (0: the training length)", between(0, MAX_TOKENS)),
        "eval_batch_size": Option(8, "prompts decoded together", between(1, 65_536), changes_results=False),
    }

    # ---- configuration ---------------------------------------------------------------------------------
    follows = {"model.max_seq_len": "task.train_length"}

    @classmethod
    def adjust(cls, sections, source) -> None:
        """``task.train_length`` (when set) is the model's training length; the longest prompt the settings ask
        for is at most ``MAX_TOKENS`` tokens (one line otherwise, before anything runs)."""
        task = sections["task"]
        if task["train_length"] > 0:
            sections["model"]["max_seq_len"] = int(task["train_length"])
        declared = {key: option.limit for key, option in cls.OPTIONS.items()}
        if not all(declared[key].admits(task[key])
                   for key in ("length_factors", "max_tokens", "interval", "train_length")):
            return                                         # out of its range: said in one line by the range check
        train_length = int(sections["model"].get("max_seq_len") or 0)
        longest = round(max(task["length_factors"]) * train_length)
        if longest > MAX_TOKENS:
            raise ConfigError(f"task.length_factors={task['length_factors']} x the training length {train_length} "
                              f"asks for prompts of {longest:,} tokens; passkey builds at most {MAX_TOKENS:,}")
        if task["mode"] == "longlora":
            points = (task["max_tokens"] or longest) // max(1, task["interval"] or train_length)
            if points > MAX_POINTS:
                raise ConfigError(f"longlora mode: task.max_tokens {task['max_tokens'] or longest} // task.interval "
                                  f"{task['interval'] or train_length} gives {points:,} length points; at most "
                                  f"{MAX_POINTS:,} (LongLoRA's test: 32)")

    def validate(self) -> None:
        need = self.builder.min_length() + len(self.tokenizer.encode(pk.answer_text(pk.KEY_HIGH - 1)))
        if self.train_length < need:
            raise ConfigError(f"passkey prompts need at least {need} tokens with this tokenizer; set "
                              f"task.train_length (now {self.train_length})")

    def _resolve_tokenizer(self):
        if self.source is None and self.opts["tokenizer"].startswith("bpe"):
            raise ConfigError("passkey has no corpus to train a BPE on; use --tokenizer byte, a Hugging Face "
                              "tokenizer, or --init a pretrain run (its tokenizer is used)")
        return super()._resolve_tokenizer()

    @property
    def builder(self) -> pk.GridBuilder:
        if getattr(self, "_builder", None) is None:
            self._builder = pk.GridBuilder(self.tokenizer)
        return self._builder

    @property
    def train_length(self) -> int:
        return int(self.config.model.get("max_seq_len") or 0)

    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @classmethod
    def encoding_context(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The longest evaluation as a multiple of the training length (RandPE's span covers it)."""
        return {"eval_length_factor": float(max(options["length_factors"]))}

    def lengths(self) -> list[int]:
        return sorted({int(round(f * self.train_length)) for f in self.opts["length_factors"]})

    def train_stream(self) -> PasskeyStream:
        tok = self.tokenizer
        return PasskeyStream(self.config.seed, self.builder, self.train_length, tok.eos_id, tok.pad_id,
                             self.opts["loss"])

    def seeds(self) -> dict[str, int]:
        return {"data": self.config.seed, "eval": self.opts["eval_seed"]}

    def data_info(self) -> dict[str, Any]:
        spec = {"template": "LongLoRA passkey_retrivial.py", "mode": self.opts["mode"],
                "train_length": self.train_length, "key_range": [pk.KEY_LOW, pk.KEY_HIGH - 1],
                "answer": "' ' + key, greedy, exact match of all answer tokens", "loss": self.opts["loss"],
                "eval_seed": self.opts["eval_seed"], "trials": self.opts["trials"]}
        return {"source": "synthetic (passkey retrieval)", "hash": config_hash(spec), **spec,
                "tokenizer": self.tokenizer.spec()}

    # ---- evaluation ------------------------------------------------------------------------------------
    def _decode_batch(self, model, device, prompts: list[list[int]], answers: list[list[int]]) -> list[list[int]]:
        n_new = max(len(a) for a in answers)
        out = model.generate(torch.tensor(prompts, device=device), max_new_tokens=n_new).tolist()
        return [row[: len(a)] for row, a in zip(out, answers)]

    def evaluate(self, model, device, reporter: Any, phases: dict) -> Evaluation:
        if self.opts["mode"] == "longlora":
            return self._evaluate_longlora(model, device, reporter)
        return self._evaluate_grid(model, device, reporter)

    def _evaluate_grid(self, model, device, reporter: Any) -> Evaluation:
        lengths, depths, trials = self.lengths(), list(self.opts["depths"]), self.opts["trials"]
        bs = self.opts["eval_batch_size"]
        correct = defaultdict(int)
        predictions: list[dict[str, Any]] = []
        bar = reporter.task("eval", total=len(lengths) * len(depths), unit="cell") if reporter else None
        done = 0
        for length in lengths:
            items = []
            for di, depth in enumerate(depths):
                for t in range(trials):
                    key = pk.grid_key(pk.trial_seed(self.opts["eval_seed"], length, di, t))
                    items.append((di, depth, build_like_training(self.builder, length, depth, key)))
            chunks = equal_length_chunks(items, bs)
            decoded = distributed.shard_map(      # batches split across torchrun's processes, gathered in order
                lambda chunk: self._decode_batch(model, device, [p.prompt_ids for _, _, p in chunk],
                                                 [p.answer_ids for _, _, p in chunk]), chunks)
            for chunk, outs in zip(chunks, decoded):
                for (di, depth, p), got in zip(chunk, outs):
                    ok = got == p.answer_ids
                    correct[(length, di)] += int(ok)
                    predictions.append({"length": length, "depth": depth, "key": p.key,
                                        "key_position": p.key_position, "prediction": self.tokenizer.decode(got),
                                        "correct": ok})
            done += len(depths)
            if bar:
                bar.update(done, length=length)
        if bar:
            bar.close()
        acc = [[correct[(L, di)] / trials for di in range(len(depths))] for L in lengths]
        grid = Grid(metric="accuracy", axes=[Axis("length", lengths), Axis("depth", depths)],
                    values=[[100 * a for a in row] for row in acc],
                    stderr=[[None if _stderr(a, trials) is None else 100 * _stderr(a, trials) for a in row]
                            for row in acc],
                    n=[[trials] * len(depths) for _ in lengths], higher_is_better=True,
                    meta={"train_max": {"length": self.train_length, "depth": 1.0}, "unit": "%"})
        metrics = {"accuracy": self._mean_metric([a for row in acc for a in row], trials)}
        inside = [a for L, row in zip(lengths, acc) if L <= self.train_length for a in row]
        beyond = [a for L, row in zip(lengths, acc) if L > self.train_length for a in row]
        if inside:
            metrics["accuracy_train_length"] = self._mean_metric(inside, trials)
        if beyond:
            metrics["accuracy_beyond"] = self._mean_metric(beyond, trials)
        for L, row in zip(lengths, acc):
            metrics[f"acc_{length_factor(L, self.train_length)}x"] = self._mean_metric(row, trials)
        return Evaluation(metrics=metrics, primary="accuracy", grids={"accuracy": grid}, predictions=predictions,
                          info={"mode": "grid", "train_length": self.train_length, "lengths": lengths,
                                "depths": depths, "trials_per_cell": trials, "chance_accuracy_pct": 100 * CHANCE,
                                "decoding": "greedy, KV cache, len(answer) tokens"})

    @staticmethod
    def _mean_metric(cell_accs: list[float], trials: int) -> Metric:
        value = 100 * sum(cell_accs) / len(cell_accs)
        errs = [_stderr(a, trials) for a in cell_accs]
        stderr = None if any(e is None for e in errs) else 100 * math.sqrt(sum(e * e for e in errs)) / len(errs)
        return Metric(value, stderr, trials * len(cell_accs))

    def _evaluate_longlora(self, model, device, reporter: Any) -> Evaluation:
        interval = self.opts["interval"] or self.train_length
        max_tokens = self.opts["max_tokens"] or max(self.lengths())
        points = pk.longlora_points(max_tokens, interval)
        if not points:
            raise ConfigError(f"longlora mode: max_tokens {max_tokens} // interval {interval} gives no length point")
        trials = self.opts["trials"]
        tok = self.tokenizer
        rows, predictions, avg_lengths, accs = [], [], [], []
        bar = reporter.task("eval", total=len(points), unit="length") if reporter else None
        for i, n_garbage in enumerate(points):
            passed = total_tokens = 0
            for seed in range(trials):                      # LongLoRA: seed = test index, at every length
                prompt, key = pk.longlora_prompt(n_garbage, seed)
                ids, answer = tok.encode(prompt), tok.encode(pk.answer_text(key))
                got = self._decode_batch(model, device, [ids], [answer])[0]
                ok = got == answer
                passed += int(ok)
                total_tokens += len(ids)
                predictions.append({"point": i, "n_garbage": n_garbage, "seed": seed, "key": int(key),
                                    "tokens": len(ids), "prediction": tok.decode(got), "correct": ok})
            avg_lengths.append(total_tokens // trials)
            accs.append(passed / trials)
            rows.append({"n_garbage": n_garbage, "avg_tokens": total_tokens // trials, "accuracy": passed / trials})
            if bar:
                bar.update(i + 1, tokens=total_tokens // trials)
        if bar:
            bar.close()
        grid = Grid(metric="accuracy", axes=[Axis("length", avg_lengths)], values=[100 * a for a in accs],
                    stderr=[None if _stderr(a, trials) is None else 100 * _stderr(a, trials) for a in accs],
                    n=[trials] * len(accs), higher_is_better=True,
                    meta={"train_max": {"length": self.train_length}, "unit": "%"})
        metrics = {"accuracy": self._mean_metric(accs, trials)}
        for L, a in zip(avg_lengths, accs):
            metrics[f"acc_{L}"] = Metric(100 * a, None if _stderr(a, trials) is None else 100 * _stderr(a, trials),
                                         trials)
        return Evaluation(metrics=metrics, primary="accuracy", grids={"accuracy_longlora": grid},
                          predictions=predictions,
                          info={"mode": "longlora", "max_tokens": max_tokens, "interval": interval,
                                "num_tests": trials, "points": rows, "train_length": self.train_length,
                                "all_accuracies": {str(r["avg_tokens"]): r["accuracy"] for r in rows},
                                "chance_accuracy_pct": 100 * CHANCE})
