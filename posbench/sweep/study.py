"""A study file: the axes of one comparison, as TOML (docs/sweeps.md).

::

    encodings = ["rope", "alibi"]          # or "rope,alibi"
    tasks = ["pretrain", "perplexity"]
    seeds = 3                              # seeds 0, 1, 2; or a list: [0, 5]
    presets = ["tiny"]                     # default: each task's own default preset
    set = ["train.log_every=5"]            # --set for every cell
    device = "auto"

    [variants]                             # an axis of named --set lists (optional)
    base = []
    "lr=3e-4" = ["lr=3e-4"]

    [task.perplexity]                      # per task: --init chaining and its own settings (optional)
    init = "pretrain"                      # start from this encoding's pretrain cell (same seed, variant)
    set = ["task.eval_tokens=4096"]

    [encoding.t5]                          # per encoding: settings of its cells only (optional)
    set = ["encoding.table_init=x-transformers"]

    [slurm]                                # the SLURM executor's defaults (the command line overrides them)
    partition = "gpu"
    time = 120
    gpus_per_cell = 1

``read_study(path)`` checks the shape (every key known, every value of its type) and returns a ``Study``;
names (tasks, encodings, presets, settings) are checked when the plan resolves each cell's configuration.
Every mistake is one line (``StudyError``). No string of a study may hold a control character (a newline in a
``[slurm]`` option or a name would become a line of its own in a SLURM job script, run as a command), and its
sizes are bounded where they are read: the file (``MAX_STUDY_BYTES``), the seeds (``MAX_SEEDS``, as ``posbench
run --seeds``; each a NumPy seed) and the cells of the plan (``MAX_CELLS``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.errors import ConfigError
from posbench.options import declared, did_you_mean
from posbench.sweep.slurm import SlurmOptions
from posbench.sweep.text import control_character, shown_list

TOP_KEYS = ("name", "encodings", "tasks", "seeds", "presets", "set", "variants", "task", "encoding", "device",
            "slurm")
TASK_KEYS = ("init", "set", "presets", "encodings")
ENCODING_KEYS = ("set",)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]*")      # the whole name: always ``NAME.fullmatch``
#: bounds of what a study file may ask for: its size, its seeds (``posbench run --seeds`` stops at the same count;
#: a seed is one of NumPy's, 0 .. 2**32 - 1, as ``posbench run --seed`` checks) and the cells of its plan
MAX_STUDY_BYTES = 1024 * 1024
MAX_SEEDS = 1000
MAX_SEED = 2**32 - 1
MAX_CELLS = 10_000
#: the longest name of a folder (NAME_MAX): the study's name names one, and each cell's id (``plan.MAX_ID_BYTES``)
MAX_NAME_BYTES = 255


class StudyError(ConfigError):
    """A study file that cannot be read or has a wrong key or value (one line)."""


@dataclass(frozen=True)
class TaskAxis:
    """One task of the study and what it alone sets."""

    name: str
    presets: tuple[str | None, ...]        # None: the task's default preset
    encodings: tuple[str, ...]
    sets: tuple[str, ...] = ()
    init: str | None = None                # the task whose cell (same encoding, seed, variant) this one starts from


@dataclass(frozen=True)
class Study:
    name: str
    path: Path
    tasks: tuple[TaskAxis, ...]
    seeds: tuple[int, ...]
    variants: dict[str, tuple[str, ...]]   # {"": ()} when the study has none
    sets: tuple[str, ...] = ()
    encoding_sets: dict[str, tuple[str, ...]] = field(default_factory=dict)   # [encoding.NAME] set, by encoding
    device: str = "auto"
    slurm: dict[str, Any] = field(default_factory=dict)
    text: str = ""                         # the file as read (copied into the output directory)


def read_study(path: Path | str) -> Study:
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"study file {path} does not exist")
    text = read_text(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"{path}: not valid TOML ({exc})") from None
    where = path.name
    no_control_characters(raw, where)
    known(raw, TOP_KEYS, where)
    if not isinstance(raw.get("encoding", {}), dict):
        raise StudyError(f"{where}: 'encoding' must be a table ([encoding.NAME] set = [...]); did you mean "
                         f"'encodings' (the study's encodings)?")
    encodings = names(raw.get("encodings"), f"{where}: encodings")
    task_names = names(raw.get("tasks"), f"{where}: tasks")
    if not task_names:
        raise StudyError(f"{where}: 'tasks' is required (a list of task names)")
    per_task = table(raw.get("task", {}), f"{where}: [task]")
    for name in per_task:
        if name not in task_names:
            raise StudyError(f"{where}: [task.{name}] is not one of the study's tasks ({', '.join(task_names)})")
    presets = presets_of(raw.get("presets"), f"{where}: presets")
    study_sets = strings(raw.get("set", []), f"{where}: set")
    tasks = []
    for name in task_names:
        own = table(per_task.get(name, {}), f"{where}: [task.{name}]")
        known(own, TASK_KEYS, f"{where}: [task.{name}]")
        task_encodings = names(own["encodings"], f"{where}: [task.{name}] encodings") if "encodings" in own \
            else encodings
        if not task_encodings:
            raise StudyError(f"{where}: no encodings for task '{name}' (give 'encodings')")
        init = own.get("init")
        if init is not None and (not isinstance(init, str) or init not in task_names or init == name):
            raise StudyError(f"{where}: [task.{name}] init = {init!r}: expected the name of another task of the "
                             f"study ({', '.join(t for t in task_names if t != name)})")
        tasks.append(TaskAxis(name, presets_of(own["presets"], f"{where}: [task.{name}] presets")
                              if "presets" in own else presets, tuple(task_encodings),
                              tuple(strings(own.get("set", []), f"{where}: [task.{name}] set")), init))
    check_no_cycle(tasks, where)
    encoding_sets = per_encoding_sets(raw.get("encoding", {}), {e for t in tasks for e in t.encodings}, where)
    variants = {}
    for key, value in table(raw.get("variants", {}), f"{where}: [variants]").items():
        if not NAME.fullmatch(key):
            raise StudyError(f"{where}: variant name {key!r}: use letters, digits and _ . = + -")
        variants[key] = tuple(strings(value, f"{where}: variant {key!r}"))
    slurm = table(raw.get("slurm", {}), f"{where}: [slurm]")
    known(slurm, tuple(declared(SlurmOptions)), f"{where}: [slurm]")
    device = raw.get("device", "auto")
    if not isinstance(device, str):
        raise StudyError(f"{where}: device must be a string (auto, cpu, cuda), got {device!r}")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise StudyError(f"{where}: name {shown_list(name)}: use letters, digits and _ . = + -")
    if len(name.encode()) > MAX_NAME_BYTES:                 # it names the study's folder (results/NAME)
        raise StudyError(f"{where}: name {shown_list(name)} is {len(name.encode())} bytes, over the "
                         f"{MAX_NAME_BYTES} of a file name")
    seeds = seeds_of(raw.get("seeds", 1), where)
    count = len(seeds) * max(1, len(variants)) * sum(len(t.presets) * len(t.encodings) for t in tasks)
    if count > MAX_CELLS:
        raise StudyError(f"{where}: {count:,} cells (tasks x presets x encodings x variants x seeds); a study plans "
                         f"at most {MAX_CELLS:,}: split it into several studies")
    return Study(name=name, path=path, tasks=tuple(tasks), seeds=tuple(seeds), variants=variants or {"": ()},
                 sets=tuple(study_sets), encoding_sets=encoding_sets, device=device, slurm=slurm, text=text)


def per_encoding_sets(raw: Any, encodings: set[str], where: str) -> dict[str, tuple[str, ...]]:
    """``[encoding.NAME] set = [...]``: the settings of one encoding's cells (its own options, such as T5's
    ``encoding.table_init``, which the other encodings of the study do not have), by encoding name."""
    sets = {}
    for name, own in raw.items():
        if name not in encodings:
            raise StudyError(f"{where}: [encoding.{name}] is not one of the study's encodings "
                             f"({', '.join(sorted(encodings))})")
        own = table(own, f"{where}: [encoding.{name}]")
        known(own, ENCODING_KEYS, f"{where}: [encoding.{name}]")
        sets[name] = tuple(strings(own.get("set", []), f"{where}: [encoding.{name}] set"))
    return sets


def read_text(path: Path) -> str:
    """The study file's text: at most ``MAX_STUDY_BYTES`` (a study is a page of TOML), UTF-8."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_STUDY_BYTES + 1)
    except OSError as exc:
        raise StudyError(f"study file {path} cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_STUDY_BYTES:
        raise StudyError(f"study file {path} is over {MAX_STUDY_BYTES // 1024} KiB; a study file is a page of TOML")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StudyError(f"study file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def no_control_characters(value: Any, where: str, key: str = "") -> None:
    """Every string of the study (keys and values, at any depth) without a control character: a newline in a
    ``[slurm]`` option, a name or a variant would be a line of its own in a SLURM job script."""
    if isinstance(value, dict):
        for k, v in value.items():
            inner = f"{key}.{k}" if key else k
            if control_character(k):
                raise StudyError(f"{where}: the key {shown_list(k)} holds a control character "
                                 f"({control_character(k)}); study keys and values are one line of printable text")
            no_control_characters(v, where, inner)
    elif isinstance(value, list):
        for item in value:
            no_control_characters(item, where, key)
    elif isinstance(value, str) and control_character(value):
        raise StudyError(f"{where}: {shown_list(key)} = {shown_list(value)} holds a control character "
                         f"({control_character(value)}); "
                         f"study keys and values are one line of printable text")


def known(mapping: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in keys:
            raise StudyError(f"{where}: unknown key '{key}'{did_you_mean(key, keys)}; keys: {', '.join(keys)}")


def table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StudyError(f"{where} must be a table")
    return value


def names(value: Any, where: str) -> list[str]:
    """A list of names, or one string of names separated by commas; each one once."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise StudyError(f"{where}: expected a list of names, got {value!r}")
    items = [v.strip() for v in items if v.strip()]
    repeated = sorted({v for v in items if items.count(v) > 1})
    if repeated:
        raise StudyError(f"{where}: {', '.join(repeated)} given twice")
    bad = [v for v in items if not NAME.fullmatch(v)]
    if bad:
        raise StudyError(f"{where}: {bad[0]!r} is not a name")
    return items


def presets_of(value: Any, where: str) -> tuple[str | None, ...]:
    return tuple(names(value, where)) or (None,)


def strings(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StudyError(f"{where}: expected a list of 'key=value' strings, got {value!r}")
    return value


def seeds_of(value: Any, where: str) -> list[int]:
    """``seeds = 3`` -> [0, 1, 2]; ``seeds = [0, 5]`` -> [0, 5]."""
    if isinstance(value, bool):
        raise StudyError(f"{where}: seeds must be a count or a list of seeds, got {value!r}")
    if isinstance(value, int):
        if not 1 <= value <= MAX_SEEDS:
            raise StudyError(f"{where}: seeds = {value}: the count must be between 1 and {MAX_SEEDS:,} "
                             f"(as posbench run --seeds)")
        return list(range(value))
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool)
                                                            and v >= 0 for v in value):
        raise StudyError(f"{where}: seeds must be a count or a non-empty list of seeds >= 0, got "
                         f"{shown_list(value)}")
    if len(value) > MAX_SEEDS:
        raise StudyError(f"{where}: {len(value):,} seeds: a study runs at most {MAX_SEEDS:,} (as posbench run --seeds)")
    big = next((v for v in value if v > MAX_SEED), None)
    if big is not None:
        raise StudyError(f"{where}: seed {big}: a seed must be between 0 and {MAX_SEED} (NumPy's range)")
    if len(set(value)) != len(value):
        again = next(v for i, v in enumerate(value) if v in value[:i])
        raise StudyError(f"{where}: seeds {shown_list(value)}: a seed is repeated ({again})")
    return list(value)


def check_no_cycle(tasks: list[TaskAxis], where: str) -> None:
    parents = {t.name: t.init for t in tasks}
    for start in parents:
        seen, node = [start], parents[start]
        while node is not None:
            if node in seen:
                raise StudyError(f"{where}: the tasks' init form a cycle: {' -> '.join([*seen, node])}")
            seen.append(node)
            node = parents[node]
