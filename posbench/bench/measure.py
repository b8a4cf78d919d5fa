"""``posbench bench``: the cost of each encoding, measured the same way for all of them.

Bench is not a task: it trains nothing and evaluates no model of the run. It is a measurement the one runner
(``posbench.runs.runner``) runs like a task's run, so that its configuration (its ``task`` section, declared here in
``Bench.OPTIONS``, with ``model`` and ``train``), run directory and record are a run's like any other:
``posbench.runs.config.task_class("bench")`` gives this class where a task's would be, and ``posbench run -t
bench`` is refused (``posbench bench`` is its command). Its presets are ``measure.toml`` beside this module.

For every encoding and sequence length: the median milliseconds of one step after warm-up (CUDA events on a
GPU, the wall clock elsewhere), tokens per second, model-FLOPs utilisation, peak memory and the ratio to RoPE
measured in the same run; the step of each mode is in ``posbench.bench.speed`` (``train`` is one step of
the engine's own ``Trainer``). A cell that runs out of memory is reported as ``oom`` and the run goes on. On a
CPU the encodings are timed round robin (one step of each in turn), so a neighbouring process slows all of them
alike, compiled or not (compiled: each one built and warmed up in turn first); on a GPU one cell at a time, each
model freed before the next is built, and its peak memory is its own: the most allocated while it was built and
stepped, above what was allocated when it began (``peak_gib``).

Each step enters autocast itself, as the engine's training does, so every step casts the weights it reads
afresh and nothing it cast outlives the cell; the runner calls ``evaluate`` outside autocast (it enters autocast
around a ``Task``'s evaluation only). Inside a surrounding autocast torch would keep every weight cast in it until that
region ends: the steps after the first would run on the first step's bf16 copies, and every earlier cell's
weights and gradients would stay on the GPU, counted in each later cell's peak (on an H100, the paper's model:
each cell's peak 1 to 2 GiB above the one before, NoPE's above RoPE's).

Compilation never falls back in silence: every cell starts from a fresh compiler, a hit recompile limit is an
error (the cell reads ``error``), and each cell records how many graphs it compiled, its graph breaks, and
whether it ran compiled (``compiled``: asked to, at least one graph, no graph break, no recompilation while
timed; None when not asked). Each finished cell is also written at once to ``cells.jsonl`` in the run's
directory, so a run that is killed keeps the cells it finished.

The run is a run like any other (``results/bench/<mode>/<run-id>/result.json``); its cells are in the record's
``evaluation.bench``, which ``compare`` renders as the efficiency table.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from posbench.bench import speed
from posbench.encodings import ENCODINGS
from posbench.errors import ConfigError
from posbench.evaluation.outcome import Evaluation
from posbench.files import append_jsonl, write_jsonl
from posbench.model import ModelConfig, Transformer
from posbench.model.attention import check_encoding_backend
from posbench.model.config import check_passes
from posbench.options import Each, OneOf, Option, at_least
from posbench.tasks.base import Runnable
from posbench.tasks.model_source import OWN
from posbench.train.device import device_name, resolve_compile, resolve_precision

BASELINE = "rope"
MODES = ("train", "forward", "decode")
#: torch.compile backends a bench may use: Inductor (the real thing), or dynamo's tracing without code generation
COMPILE_BACKENDS = ("inductor", "eager", "aot_eager")
CELLS_FILE = "cells.jsonl"


@dataclass
class Cell:
    encoding: str
    length: int
    batch: int
    status: str = "ok"              # ok | oom | error
    ms: float | None = None         # median per step (train, forward) or per new token (decode)
    ms_all: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None   # GPU: the most allocated while the cell ran, above what was allocated before it
    x_rope: float | None = None
    params: int | None = None
    flops_per_token: float | None = None
    compiled: bool | None = None    # ran compiled (None: not asked to compile)
    graphs: int | None = None       # graphs compiled for the cell (FlexAttention's kernels on CUDA included)
    graph_breaks: int | None = None
    error: str | None = None

    def fail(self, exc: BaseException) -> None:
        self.status = "oom" if speed.is_oom(exc) else "error"
        self.error = " ".join(str(exc).split())[:300] or type(exc).__name__
        self.ms_all = []


class Bench(Runnable):
    """The benchmark as the runner runs it: its ``task`` section (``OPTIONS``), configuration hooks and the
    measurement as ``evaluate`` (called outside autocast); the rest is ``Runnable``'s defaults (no training)."""

    name = "bench"
    description = "speed: step time, tokens/s, MFU, peak memory and the ratio to RoPE of each encoding"
    OPTIONS = {
        "encodings": Option([], "encodings to time (RoPE always, first: ratios are to it); empty: every one"),
        "lengths": Option([256], "sequence lengths", Each(at_least(1))),
        "batch": Option([8], "sequences per step: one per length (a single value, or a list longer than the lengths, "
                        "gives its first to every length)", Each(at_least(1))),
        "mode": Option("train", "train (the engine's optimizer step), forward, or decode (ms per new token)",
                       OneOf(MODES)),
        "warmup": Option(3, "untimed steps first", at_least(0)),
        "steps": Option(10, "timed steps per cell (the median is reported)", at_least(1), flag="timed-steps"),
        "new_tokens": Option(32, "decode: tokens per timed run", at_least(1)),
        "peak_tflops": Option(0.0, "the device's dense bf16 peak (0: known GPUs are recognised)", at_least(0)),
        "vocab_size": Option(256, "the models' vocabulary", at_least(2)),
        "compile_backend": Option("inductor", "torch.compile backend when train.compile is on: inductor, or eager / "
                                  "aot_eager (trace only: checks the graphs, times nothing real)",
                                  OneOf(COMPILE_BACKENDS)),
        "cells_to": Option("", "also append every cell, one JSON line, to this file the moment it finishes (a GPU "
                               "call's $OUT: a kill keeps every finished cell); empty: none", changes_results=False),
    }
    model_source = OWN                            # a model per cell, built by the bench itself

    @classmethod
    def adjust(cls, sections, source) -> None:
        task = sections["task"]
        repeated = sorted({e for e in task["encodings"] if e and task["encodings"].count(e) > 1})
        if repeated:
            raise ConfigError(f"bench: encoding {', '.join(repeated)} given twice (RoPE, the baseline, is timed first "
                              f"whether named or not)")
        names = [e for e in task["encodings"] if e] or sorted(ENCODINGS)
        task["encodings"] = list(dict.fromkeys([BASELINE, *names]))      # ratios are to RoPE: always, first
        context = cls.encoding_context(task)
        for name in task["encodings"]:
            encoding = ENCODINGS.get(name)          # unknown names: one line, before anything runs
            missing = [key for key in encoding.task_context if key not in context]
            if missing:
                raise ConfigError(f"bench cannot time encoding '{name}': it needs {', '.join(missing)}, which "
                                  f"bench does not give")
            check_encoding_backend(sections["model"]["attention"], name, encoding.bias_from_qk)
            try:
                check_passes(name, encoding.one_pass, sections["model"]["recurrences"],
                             sections["model"]["eval_recurrences"])
            except ConfigError as exc:
                others = [n for n in task["encodings"] if not ENCODINGS.get(n).one_pass]
                raise ConfigError(f"bench: {exc}, or leave it out: --encodings {','.join(others)}") from None
        if len(task["batch"]) != len(task["lengths"]):
            task["batch"] = task["batch"][:1] * len(task["lengths"])

    @classmethod
    def encoding_context(cls, options) -> dict[str, Any]:
        """The models read random tokens of the whole vocabulary; ids 0-9 are called the digits (Abacus: about
        4% of the tokens with the default vocabulary of 256; its cost does not depend on which tokens are
        digits, every step of it is a dense tensor operation)."""
        return {"digit_ids": list(range(10))}

    @classmethod
    def label_for(cls, encoding, source, options) -> str:
        return options["mode"]

    # ---- measuring ---------------------------------------------------------------------------------------
    def evaluate(self, model, device: torch.device, reporter: Any, phases: dict) -> Evaluation:
        o = self.opts
        if torch.is_autocast_enabled(device.type):
            raise RuntimeError("bench ran inside autocast: each step enters its own, and a surrounding "
                               "autocast keeps every cell's weights alive (and its casts stale) until it ends")
        precision = resolve_precision(self.config.training.precision, device)
        peak, peak_source = speed.device_peak(device, o["peak_tflops"] or None)
        total = len(o["lengths"]) * len(o["encodings"]) * (o["warmup"] + o["steps"])
        bar = reporter.task(f"bench {o['mode']}", total=total, unit="step")
        try:
            with torch.enable_grad(), speed.strict_compilation():   # training steps need gradients
                cells = self.run_cells(device, precision, peak, lambda done: bar.update(done))
        finally:
            bar.close()
        bench = {"device_name": device_name(device), "peak_tflops": peak,
                 "peak_source": peak_source, "timer": "cuda events" if device.type == "cuda" else "perf_counter",
                 "unit": "ms/token" if o["mode"] == "decode" else "ms/step",
                 "flops": "6 N + 12 layers width length per trained token (a third for forward); N excludes the "
                          "input embedding table",
                 "cells": [asdict(cell) for cell in cells]}
        return Evaluation(metrics={}, primary=None, info={"bench": bench})

    def run_cells(self, device: torch.device, precision: str, peak: float | None,
                  progress: Callable[[int], None]) -> list[Cell]:
        cells: list[Cell] = []
        done = [0]

        def tick() -> None:
            done[0] += 1
            progress(done[0])
        for length, batch in zip(self.opts["lengths"], self.opts["batch"]):
            group = [Cell(encoding, length, batch) for encoding in self.opts["encodings"]]
            if device.type == "cuda":
                for cell in group:
                    self.time_alone(cell, device, precision, tick)
                    release(device)                 # the cell's model is gone before the next one is built
                    summarise(cell, self.opts, peak)
                    self.keep(cells + [cell])
                    cells.append(cell)
                continue
            in_turns = self.time_compiled_in_turns if self.compiled(device) else self.time_round_robin
            in_turns(group, device, precision, tick)
            release(device)
            for cell in group:
                summarise(cell, self.opts, peak)
            cells += group
            self.keep(cells)
        ratios(cells)
        return cells

    def compiled(self, device: torch.device) -> bool:
        return resolve_compile(self.config.training.compile, device)

    def compile_options(self, device: torch.device) -> dict[str, Any] | None:
        """``torch.compile``'s options for the cells (None: not compiled): the backend, and CUDA graphs for
        decoding with Inductor on CUDA (gpt-fast's ``reduce-overhead``)."""
        if not self.compiled(device):
            return None
        options: dict[str, Any] = {"backend": self.opts["compile_backend"]}
        if self.opts["mode"] == "decode" and device.type == "cuda" and options["backend"] == "inductor":
            options["mode"] = "reduce-overhead"
        return options

    def keep(self, cells: list[Cell]) -> None:
        """The finished cells, written at once: the new ones appended to ``cells_to`` (flushed to disk), then all of
        them to the run directory (a killed run keeps them)."""
        target = self.opts.get("cells_to")
        kept = getattr(self, "appended", 0)
        run_dir = getattr(self, "run_dir", None)
        if target and len(cells) > kept:
            which = {"mode": self.opts["mode"], "run": run_dir.name if run_dir is not None else None}
            append_jsonl(Path(target), [{**asdict(cell), **which} for cell in cells[kept:]])
            self.appended = len(cells)
        if run_dir is not None:
            write_jsonl(run_dir / CELLS_FILE, [asdict(cell) for cell in cells])

    def prepare(self, cell: Cell, device: torch.device, precision: str) -> Callable[[], float] | None:
        """Build the cell's model and its step (recording its size); None if that fails (recorded in the cell)."""
        o, train = self.opts, self.config.training
        rounds = o["warmup"] + o["steps"]
        try:
            torch.manual_seed(0)
            shape = {**self.config.model, "max_seq_len": cell.length}
            context = self.encoding_context(o)
            options = {key: context[key] for key in ENCODINGS[cell.encoding].task_context}
            model = Transformer(ModelConfig(vocab_size=o["vocab_size"], encoding=cell.encoding,
                                            encoding_options=options, **shape)).to(device)
            cell.params = model.num_parameters()
            cell.flops_per_token = speed.flops_per_token(model, cell.length, o["mode"])
            options = self.compile_options(device)
            if o["mode"] == "train":
                return speed.train_step(model, cell.length, cell.batch, device, train, rounds, options)
            if o["mode"] == "forward":
                return speed.forward_step(model, cell.length, cell.batch, device, precision, options)
            return speed.decode_step(model, cell.length, cell.batch, device, precision, options, o["new_tokens"])
        except Exception as exc:  # noqa: BLE001 - a failed cell is recorded, the run goes on
            cell.fail(exc)
            return None

    def time_alone(self, cell: Cell, device: torch.device, precision: str, tick: Callable[[], None]) -> None:
        speed.fresh_compiler()
        before = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)     # what the cells before left: not this cell's
        step = self.prepare(cell, device, precision)
        if step is None:
            return
        warmup, timed_graphs = self.opts["warmup"], 0
        try:
            for i in range(warmup + self.opts["steps"]):
                ms = step()
                if i == warmup - 1:
                    timed_graphs = -speed.compile_counts()[0]
                if i >= warmup:
                    cell.ms_all.append(ms)
                tick()
        except Exception as exc:  # noqa: BLE001 - a recompile limit hit, an OOM: recorded, the run goes on
            cell.fail(exc)
        finally:
            cell.graphs, cell.graph_breaks = speed.compile_counts()
            if self.compiled(device):           # graphs compiled while timed: a recompilation
                recompiled = warmup > 0 and cell.graphs + timed_graphs > 0
                cell.compiled = cell.status == "ok" and cell.graphs > 0 and cell.graph_breaks == 0 and not recompiled
        if device.type == "cuda" and cell.status == "ok":
            cell.peak_gib = (torch.cuda.max_memory_allocated(device) - before) / 2**30

    def time_compiled_in_turns(self, group: list[Cell], device: torch.device, precision: str,
                               tick: Callable[[], None]) -> None:
        """Compiled, on a CPU: each encoding built, compiled and warmed up in turn (its graphs and graph breaks
        counted on their own), then the timed steps one of each in turn, as ``time_round_robin`` times eager ones,
        so a neighbouring process slows all of them alike. Every compiled model stays live, so dynamo's recompile
        limit is raised to cover the group (a hit is still an error: ``strict_compilation``); a graph compiled
        during a cell's timed steps is a recompilation (``compiled`` false)."""
        speed.fresh_compiler()
        warmup = self.opts["warmup"]
        steps: dict[str, Callable[[], float]] = {}
        recompiled: set[str] = set()
        limit = max(8, 2 * len(group))
        config = torch._dynamo.config
        names = {"recompile_limit": limit, "cache_size_limit": limit, "accumulated_recompile_limit": 8 * limit,
                 "accumulated_cache_size_limit": 8 * limit}             # the names differ between torch releases
        with config.patch(**{k: max(v, getattr(config, k)) for k, v in names.items() if hasattr(config, k)}):
            for cell in group:
                graphs, breaks = speed.compile_counts()
                step = self.prepare(cell, device, precision)
                try:
                    for _ in range(warmup if step is not None else 0):
                        step()
                        tick()
                except Exception as exc:  # noqa: BLE001 - a recompile limit hit: recorded, the run goes on
                    cell.fail(exc)
                    step = None
                now = speed.compile_counts()
                cell.graphs, cell.graph_breaks = now[0] - graphs, now[1] - breaks
                if step is not None:
                    steps[cell.encoding] = step
            for _ in range(self.opts["steps"]):
                for cell in group:
                    if cell.encoding not in steps:
                        continue
                    before = speed.compile_counts()
                    try:
                        cell.ms_all.append(steps[cell.encoding]())
                    except Exception as exc:  # noqa: BLE001
                        cell.fail(exc)
                        del steps[cell.encoding]
                        continue
                    after = speed.compile_counts()
                    cell.graphs += after[0] - before[0]             # without warm-up it compiles here
                    cell.graph_breaks += after[1] - before[1]
                    if after[0] != before[0] and warmup > 0:
                        recompiled.add(cell.encoding)
                    tick()
        for cell in group:
            cell.compiled = cell.status == "ok" and cell.graphs > 0 and cell.graph_breaks == 0 and \
                cell.encoding not in recompiled

    def time_round_robin(self, group: list[Cell], device: torch.device, precision: str,
                         tick: Callable[[], None]) -> None:
        """One step of each encoding in turn, so a neighbouring process slows all of them alike."""
        steps = {cell.encoding: step for cell in group if (step := self.prepare(cell, device, precision))}
        for round_ in range(self.opts["warmup"] + self.opts["steps"]):
            for cell in group:
                if cell.encoding not in steps:
                    continue
                try:
                    ms = steps[cell.encoding]()
                except Exception as exc:  # noqa: BLE001
                    cell.fail(exc)
                    del steps[cell.encoding]
                    continue
                if round_ >= self.opts["warmup"]:
                    cell.ms_all.append(ms)
                tick()


def summarise(cell: Cell, opts: dict[str, Any], peak: float | None) -> None:
    if cell.status != "ok" or not cell.ms_all:
        return
    cell.ms = statistics.median(cell.ms_all)
    tokens = cell.batch if opts["mode"] == "decode" else cell.batch * cell.length
    cell.tokens_per_s = tokens / (cell.ms / 1000)
    if peak and opts["mode"] != "decode" and cell.flops_per_token:
        cell.mfu = cell.flops_per_token * cell.tokens_per_s / (peak * 1e12)


def ratios(cells: list[Cell]) -> None:
    baseline = {c.length: c.ms for c in cells if c.encoding == BASELINE and c.ms}
    for cell in cells:
        if cell.ms and baseline.get(cell.length):
            cell.x_rope = cell.ms / baseline[cell.length]


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
