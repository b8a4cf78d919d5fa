"""A study expanded into cells: one cell is one ``posbench run`` (task x encoding x preset x variant x seed).

Each cell has a stable id (``arithmetic-rope-tiny-s0``, with the variant before the seed when the study has
variants) that names its folder in the output directory, so a rerun of the same study finds every cell's run
again. A cell of a task with ``init = "pretrain"`` starts from the pretrain cell of the same encoding, seed and
variant (and preset, when the pretrain task has several): its ``parent``.

The cells are in the order they are started: seed 0 of every cell first (a stopped study stays balanced), and a
cell after the cell it starts from. ``validate`` resolves every cell's configuration (names, presets, every
``--set`` key and range) before anything runs; a cell that starts from another is resolved as a fresh run, since
its ``--init`` run does not exist yet.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from posbench.errors import UserError
from posbench.runs.config import parse_assignment, resolve_run_config
from posbench.sweep.study import MAX_NAME_BYTES, Study, StudyError
from posbench.sweep.text import shown_list
from posbench.tasks import TASKS
from posbench.tasks.presets import preset_of

#: the longest cell id: it names the cell's folder
MAX_ID_BYTES = MAX_NAME_BYTES


@dataclass(frozen=True)
class Cell:
    task: str
    encoding: str
    preset: str
    seed: int
    variant: str                    # "" when the study has no variants
    sets: tuple[str, ...]           # the study's, the task's, the encoding's, then the variant's --set
    device: str = "auto"
    parent: str | None = None       # the id of the cell whose run this one starts from (--init)
    expected_s: float | None = None  # the preset's expected time (seconds on its hardware), or None

    @property
    def id(self) -> str:
        parts = [self.task, self.encoding, self.preset, *([self.variant] if self.variant else []), f"s{self.seed}"]
        return "-".join(parts)

    def run_args(self) -> list[str]:
        """``posbench run`` arguments, without ``--init`` (the sweep adds it when the parent has finished) and
        without ``--out`` (the cell's folder)."""
        args = ["run", "-e", self.encoding, "-t", self.task, "-p", self.preset, "--seed", str(self.seed),
                "--device", self.device]
        for item in self.sets:
            args += ["--set", item]
        return args

    def fingerprint(self) -> str:
        """What the cell computes, hashed: a rerun into the same folder must mean the same cell."""
        what = [self.task, self.encoding, self.preset, self.seed, list(self.sets), self.parent]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def expand(study: Study) -> list[Cell]:
    cells: dict[tuple, Cell] = {}
    for axis in study.tasks:
        task_cls = TASKS.get(axis.name)
        for preset in axis.presets:
            preset = task_cls.default_preset if preset is None else preset
            expected = (preset_of(task_cls, preset).get("expected") or {}).get("seconds")
            for variant, variant_sets in study.variants.items():
                for encoding in axis.encodings:       # the same for every seed: resolved once
                    sets = (*study.sets, *axis.sets, *study.encoding_sets.get(encoding, ()), *variant_sets)
                    expected_s = scaled_expected(axis.name, encoding, preset, sets, expected)
                    for seed in study.seeds:
                        cell = Cell(axis.name, encoding, preset, seed, variant, sets, study.device,
                                    expected_s=expected_s)
                        cells[(axis.name, encoding, preset, variant, seed)] = cell
    by_task = {axis.name: axis for axis in study.tasks}
    by_parent_key: dict[tuple, list[Cell]] = {}       # (task, encoding, variant, seed) -> its cells, any preset
    for (task, encoding, _, variant, seed), cell in cells.items():
        by_parent_key.setdefault((task, encoding, variant, seed), []).append(cell)
    linked = {}
    for key, cell in cells.items():
        init = by_task[cell.task].init
        if init is not None:
            candidates = by_parent_key.get((init, cell.encoding, cell.variant, cell.seed), [])
            parent = parent_of(cell, by_task[init].presets, init, {(init, c.encoding, c.preset, c.variant, c.seed): c
                                                                   for c in candidates})
            cell = Cell(**{**cell.__dict__, "parent": parent.id})
        linked[key] = cell
    depth = {axis.name: task_depth(axis.name, by_task) for axis in study.tasks}
    order = {axis.name: i for i, axis in enumerate(study.tasks)}
    seed_order = {seed: i for i, seed in enumerate(study.seeds)}
    ids = [cell.id for cell in linked.values()]
    if len(set(ids)) != len(ids):
        raise StudyError(f"{study.path.name}: two cells would share one id; rename a variant")
    long = next((cell for cell in linked.values() if len(cell.id.encode()) > MAX_ID_BYTES), None)
    if long is not None:                              # its folder could not be made: say so before anything runs
        what = f"variant {shown_list(long.variant)}" if long.variant else "its names"
        raise StudyError(f"{study.path.name}: cell {shown_list(long.id)} names its folder, and is "
                         f"{len(long.id.encode())} bytes, over the {MAX_ID_BYTES} of a file name; shorten {what}")
    return sorted(linked.values(), key=lambda c: (seed_order[c.seed], depth[c.task], order[c.task]))


def scaled_expected(task: str, encoding: str, preset: str, sets: tuple[str, ...], expected: Any) -> float | None:
    """The preset's expected seconds, scaled by the steps the study's ``set`` gives against the preset's own
    (training dominates a cell: ``train.steps=3000`` on a 300-step preset expects ten times as long); unscaled
    when the steps cannot be resolved (``validate`` reports why)."""
    if not isinstance(expected, (int, float)):
        return None
    try:
        own = resolve_run_config(task, encoding, preset).train["steps"]
        given = resolve_run_config(task, encoding, preset, sets=list(sets)).train["steps"]
    except UserError:
        return float(expected)
    return float(expected) * (given / own if own else 1.0)


def parent_of(cell: Cell, parent_presets: tuple, init: str, cells: dict[tuple, Cell]) -> Cell:
    """The cell of task ``init`` that ``cell`` starts from: same encoding, seed and variant; the same preset when
    the parent task has it in the study, else the parent task's only preset."""
    candidates = [c for (task, encoding, _, variant, seed), c in cells.items()
                  if task == init and encoding == cell.encoding and variant == cell.variant and seed == cell.seed]
    same = [c for c in candidates if c.preset == cell.preset]
    chosen = same or (candidates if len(candidates) == 1 else [])
    if not chosen:
        what = "no" if not candidates else f"several ({', '.join(c.preset for c in candidates)}) and none"
        raise StudyError(f"cell {cell.id} starts from task '{init}', but the study has {what} {init} cell of "
                         f"encoding '{cell.encoding}' (seed {cell.seed}, preset {cell.preset}); add the encoding "
                         f"to task '{init}'")
    return chosen[0]


def task_depth(task: str, by_task: dict) -> int:
    depth = 0
    while by_task[task].init is not None:
        task, depth = by_task[task].init, depth + 1
    return depth


def validate(cells: list[Cell]) -> None:
    """Resolve each cell's configuration as ``posbench run`` would; the first problem is one line naming the cell."""
    resolved: dict[tuple, str] = {}
    for cell in cells:
        key = (cell.task, cell.encoding, cell.preset, cell.sets, cell.device)
        if key in resolved:                       # seeds and parents do not change what is checked
            continue
        try:
            config = resolve_run_config(cell.task, cell.encoding, cell.preset, seed=cell.seed, device=cell.device,
                                        sets=list(cell.sets))
            for item in cell.sets:
                parse_assignment(item)
        except UserError as exc:
            raise StudyError(f"cell {cell.id}: {exc}") from None
        recorded = {k: v for k, v in config.to_dict().items() if k != "seed"}
        resolved[key] = json.dumps(recorded, sort_keys=True, default=str)
    no_twins(cells, resolved)


def no_twins(cells: list[Cell], resolved: dict[tuple, str]) -> None:
    """Refuse two cells that would run one configuration (the same resolved settings and seed, from the same
    parent's): variants that spell one setting two ways (``lr=1e-3``, ``train.lr=0.001``), or give a preset's own
    value, plan the same run twice. ``resolved``: each cell's configuration (``validate``'s), by its key."""
    by_id = {cell.id: cell for cell in cells}
    runs: dict[str, str] = {}

    def run_of(cell: Cell) -> str:
        if cell.id not in runs:
            parent = by_id.get(cell.parent) if cell.parent else None
            key = (cell.task, cell.encoding, cell.preset, cell.sets, cell.device)
            runs[cell.id] = json.dumps([resolved[key], cell.seed, run_of(parent) if parent else cell.parent])
        return runs[cell.id]

    first: dict[str, Cell] = {}
    for cell in cells:
        twin = first.setdefault(run_of(cell), cell)
        if twin is not cell:
            raise StudyError(f"cells {twin.id} and {cell.id} would run one configuration: variants "
                             f"{shown_list(twin.variant)} and {shown_list(cell.variant)} give the same settings; "
                             f"drop one, or give it a setting of its own")

