"""The one kind of run configuration (``RunConfig``), built for ``run``, ``extend`` and ``bench`` alike.

A run's configuration has four sections, each a flat dict of typed keys:

- ``model``: ``ModelConfig`` fields (``d_model``, ``n_layers``, ``n_heads``, ``d_ff``, ``max_seq_len``,
  ``attention``, ...). ``vocab_size`` and ``encoding`` are not keys: the task and ``--encoding`` set them.
- ``encoding``: the options of the chosen encoding (or, for ``extend``, of the extension method), e.g.
  ``encoding.theta=500``; ``method.KEY`` is accepted as a synonym.
- ``train``: ``TrainConfig`` fields (``steps``, ``batch_size``, ``lr``, ``warmup_ratio``, ...); the resolved
  config carries them typed too, as one ``TrainConfig`` (``RunConfig.training``: built here, once, and passed
  down to the runner, the task's phases and the trainer).
- ``task``: the task's own options (e.g. ``task.train_digits=6``, ``task.data=PATH``).

Resolution, in one place (``resolve_run_config``): built-in defaults, the task's preset, the ``--init``
model's architecture (resolved once into an ``InitSource``), the typed ``settings`` (``Setting``: section, key,
typed value; the command line's flags, made so by ``posbench.cli.setting_flags``), the ``sets`` text
(``--set`` entries, a study's: each parsed once here, located and typed), the task's own adjustments
(``Task.adjust``), the encoding options only the task can give (``Task.encoding_context`` for the keys the
encoding names in ``task_context``: Abacus's ``digit_ids``; refused in one line on a task that gives none), then
every section range-checked by its one check (``posbench.options``, ``ModelConfig``'s, ``TrainConfig``'s).
``--set`` accepts ``section.key=value`` or a bare ``key=value`` when the key exists in exactly one section.
Errors are one line (``ConfigError``).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from posbench import options as opts
from posbench.errors import ConfigError
from posbench.model.config import RENAMED, current_names
from posbench.runs.init import InitSource, resolve_init

__all__ = ["ConfigError", "RunConfig", "Setting", "resolve_run_config", "with_source", "apply_overrides"]

SECTIONS = ("model", "encoding", "train", "task")
MAX_SEED = 2**32 - 1                    # NumPy's seeds: 0 .. 2**32 - 1
SECTION_SYNONYMS = {"method": "encoding"}
MODEL_KEYS_EXCLUDED = ("vocab_size", "encoding", "encoding_options")


class Setting(NamedTuple):
    """One setting as the command line gave it, read once: its section (``model``, ``train``, ``task``,
    ``encoding``; a flag that names its encoding, ``--rope-theta``: ``encoding:rope`` until
    ``posbench.cli.setting_flags.for_encoding`` picks each run's), its key and its typed value."""

    section: str
    key: str
    value: Any


@dataclass
class RunConfig:
    """Everything needed to reproduce a run (``config.json`` and ``result.json`` record it)."""

    task: str
    encoding: str | None                    # a name of the task's encoding registry; None: the --init model's own
    preset: str
    task_version: int = 1                   # the task's ``version`` (records written before versions existed: 1)
    label: str = ""                         # the run's name in tables and directories (encoding, llama+tape, ...)
    seed: int = 0
    device: str = "auto"
    init: str | None = None                 # what --init named
    source: InitSource | None = None        # what it resolved to
    model: dict[str, Any] = field(default_factory=dict)
    encoding_options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    task_options: dict[str, Any] = field(default_factory=dict)
    logs: list[str] = field(default_factory=list)      # experiment loggers (--log)

    def __post_init__(self):
        self.label = self.label or self.encoding or (self.source.label if self.source else "") or self.task

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["source"] = self.source.to_dict() if self.source is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, earlier_values: bool = False) -> RunConfig:
        """A recorded config (this version's, or an older one's) without opening any other file.
        ``earlier_values``: fill in the settings added after it was written at the values it ran with
        (``with_earlier_values``), for running it again (``--resume``); compare reads records as written (its
        grouping knows those values itself)."""
        missing = {"task", "preset"} - set(data)
        if missing:
            raise ConfigError(f"run config lacks {', '.join(sorted(missing))}")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key in ("model", "model_config"):           # a setting recorded under an older name: its current one
            if isinstance(values.get(key), dict):
                values[key] = current_names(values[key])
        if isinstance(values.get("source"), dict):
            values["source"] = InitSource.from_dict(values["source"])
        values.setdefault("encoding", None)
        values["task_version"] = values.get("task_version") or 1      # written before tasks had versions: 1
        if earlier_values:
            with_earlier_values(values)
        return cls(**values)

    def section(self, name: str) -> dict[str, Any]:
        return {"model": self.model, "encoding": self.encoding_options, "train": self.train,
                "task": self.task_options}[name]

    @cached_property
    def training(self) -> Any:
        """The ``train`` section as one typed ``TrainConfig`` (the runner, the task's phases and the trainer take
        this one): ``resolve_run_config`` sets the one it checked; a recorded config (``--resume``) builds it when
        first asked."""
        return train_config(self.train)


def earlier_values(encoding: str | None, task: str | None) -> dict[str, dict[str, Any]]:
    """By section (``model``, ``train``, ``encoding``, ``task``): the settings added after runs were recorded
    without them, each at the value those runs had (``Added.before``; T5's ``table_init``: x-transformers' before
    issue 47, T5's own since), from the declarations of a record's own classes: its encoding's options are its own
    (two encodings may declare one name, only one of them as added), and so are its task's."""
    from posbench.model.config import ModelConfig
    from posbench.options import declared
    from posbench.registry import ENCODINGS
    from posbench.tasks import TASKS
    from posbench.train.config import TrainConfig

    owners = {"model": ModelConfig, "train": TrainConfig,
              "encoding": ENCODINGS[encoding] if encoding in ENCODINGS else None,
              "task": TASKS[task] if task in TASKS else None}
    return {section: {name: option.added.before for name, option in declared(owner).items()
                      if getattr(option, "added", None) is not None}
            for section, owner in owners.items() if owner is not None}


#: where each section of settings lies in a recorded config
RECORDED_SECTIONS = {"model": "model", "train": "train", "encoding": "encoding_options", "task": "task_options"}


def with_earlier_values(values: dict[str, Any]) -> None:
    """A recorded section written before one of its settings existed lacks it, and that run had the setting's
    earlier value (``earlier_values``), not today's default: fill it in. A section the record does not hold stays
    empty."""
    for section, earlier in earlier_values(values.get("encoding"), values.get("task")).items():
        key = RECORDED_SECTIONS[section]
        recorded = values.get(key)
        if not isinstance(recorded, dict) or not recorded:
            continue
        # a new dict (the record as read stays as it was), its own keys first, in their order
        values[key] = {**recorded, **{name: value for name, value in earlier.items() if name not in recorded}}


def train_config(values: dict[str, Any]) -> Any:
    """The one place a run's ``TrainConfig`` is built from its ``train`` section (and so checked)."""
    from posbench.train.config import TrainConfig

    return TrainConfig(**values)


# ---- --set and the other overrides ---------------------------------------------------------------------------

def parse_assignment(text: str) -> tuple[str, str]:
    """``"key=value"`` -> ``("key", "value")``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    return key, value.strip()


def typed(where: str, value: Any, like: Any, limit: Any = None) -> Any:
    """``value`` (text from the command line, or a preset's TOML value) as the type of ``like`` (a ``Switch`` key:
    true, false or auto); the ranges are checked when the sections are complete."""
    return limit.parse(where, value) if isinstance(limit, (opts.Switch, opts.Fractions)) else \
        opts.coerce(where, value, like)


def read_settings(sections: dict[str, dict[str, Any]], overrides: dict[str, Any] | Sequence[tuple[str, Any]],
                  origin: str = "--set", limits: dict[str, dict[str, Any]] | None = None) -> list[Setting]:
    """``{"section.key" or "key": value}`` (or those pairs, in order) as ``Setting``s: each key located in
    ``sections`` (one line for an unknown or ambiguous one), each value typed as its key's."""
    found = []
    for raw_key, value in (overrides.items() if isinstance(overrides, dict) else overrides):
        section, key = locate_key(sections, raw_key, origin)
        where = raw_key if "." in raw_key else f"{section}.{key}"       # as written (method.r is encoding.r)
        found.append(Setting(section, key, typed(where, value, sections[section][key],
                                                 (limits or {}).get(section, {}).get(key))))
    return found


def apply_settings(sections: dict[str, dict[str, Any]], settings: Sequence[Setting]) -> None:
    """The typed ``settings`` onto ``sections``, in order (of one key given twice, the last)."""
    for setting in settings:
        if setting.key not in sections.get(setting.section, {}):
            raise ConfigError(f"{setting.section}.{setting.key}: unknown setting")
        sections[setting.section][setting.key] = setting.value


def apply_overrides(sections: dict[str, dict[str, Any]], overrides: dict[str, Any], origin: str = "--set",
                    limits: dict[str, dict[str, Any]] | None = None) -> None:
    """Apply ``{"section.key" or "key": value}`` onto ``sections`` in place, coerced to each key's type (a
    ``Switch`` key to true, false or auto); the ranges are checked when the sections are complete."""
    apply_settings(sections, read_settings(sections, overrides, origin, limits))


def locate_key(sections: dict[str, dict[str, Any]], raw_key: str, origin: str = "--set") -> tuple[str, str]:
    if "." in raw_key:
        section, key = raw_key.split(".", 1)
        section = SECTION_SYNONYMS.get(section, section)
        if section == "model":
            key = RENAMED.get(key, key)
        if section not in sections:
            raise ConfigError(f"{origin} {raw_key}: unknown section '{section}'; sections: {', '.join(SECTIONS)}")
        if key not in sections[section]:
            raise ConfigError(f"{origin} {raw_key}: unknown key '{key}'{opts.did_you_mean(key, sections[section])}; "
                              f"{section} keys: {', '.join(sorted(sections[section])) or 'none'}")
        return section, key
    owners = [name for name, values in sections.items() if raw_key in values]
    if len(owners) == 1:
        return owners[0], raw_key
    if len(owners) > 1:
        raise ConfigError(f"{origin} {raw_key}: ambiguous, say which: "
                          f"{', '.join(f'{o}.{raw_key}' for o in owners)}")
    bare = {k: f"{s}.{k}" for s, values in sections.items() for k in values}
    close = difflib.get_close_matches(raw_key, list(bare), n=1, cutoff=0.6)
    hint = f" Did you mean '{bare[close[0]]}'?" if close else ""
    raise ConfigError(f"{origin} {raw_key}: unknown key.{hint} Run 'posbench ls presets' for the keys "
                      f"({len(bare)} in all)")


# ---- resolution ------------------------------------------------------------------------------------------

def model_options() -> dict[str, opts.Option]:
    """The ``model`` section's options: ``ModelConfig``'s, less those the task and ``--encoding`` set."""
    from posbench.model import ModelConfig

    return {k: o for k, o in opts.declared(ModelConfig).items() if k not in MODEL_KEYS_EXCLUDED}


def train_options() -> dict[str, opts.Option]:
    from posbench.train.config import TrainConfig

    return opts.declared(TrainConfig)


def model_defaults() -> dict[str, Any]:
    return {k: o.default for k, o in model_options().items()}


def train_defaults() -> dict[str, Any]:
    return {k: o.default for k, o in train_options().items()}


def limits_of(options: dict[str, opts.Option]) -> dict[str, opts.Limit]:
    return {k: o.limit for k, o in options.items() if o.limit is not None}


BENCH = "bench"


def task_class(name: str) -> Any:
    """The class that declares a run's ``task`` section and that the runner runs: a task of ``TASKS``, or
    ``posbench bench``'s measurement (``posbench.bench.Bench``: not a task, its runs are ``task: "bench"``)."""
    if name == BENCH:
        from posbench.bench import Bench

        return Bench
    from posbench.tasks import TASKS

    return TASKS.get(name)


def resolve_run_config(task: str, encoding: str | None, preset: str | None = None, *,
                       seed: int | None = None, device: str | None = None, init: str | None = None,
                       settings: Sequence[Setting] = (), sets: Sequence[str] = (),
                       logs: list[str] | tuple[str, ...] = (), init_flag: str = "--init") -> RunConfig:
    """The one precedence: the declared defaults -> the task's preset -> the ``--init`` model -> the typed
    ``settings`` in their order (the command line's flags: ``posbench.cli.setting_flags``) -> the ``sets`` text in
    their order (``--set section.key=value`` entries, a study's: each parsed once, here) -> the task's
    adjustments; everything range-checked, and the ``train`` section built into its ``TrainConfig``."""
    if seed is not None and not 0 <= int(seed) <= MAX_SEED:
        raise ConfigError(f"--seed {seed}: a seed must be between 0 and {MAX_SEED} (NumPy's range)")
    task_cls, preset, source, encoding, encoding_cls, sections, limits = starting_point(task, encoding, preset,
                                                                                         init, init_flag)
    given = [*settings, *read_settings(sections, [parse_assignment(item) for item in sets], limits=limits)]
    apply_settings(sections, given)
    task_cls.adjust(sections, source)
    fill_task_context(task_cls, encoding, encoding_cls, sections, {(s.section, s.key) for s in given})
    checked = check_sections(task_cls, encoding_cls, sections)
    if logs:
        from posbench.loggers import validate

        logs = validate(logs)                      # an unknown name or a missing package: one line, now
    config = RunConfig(task=task, encoding=encoding, preset=preset, task_version=task_cls.version,
                       label=task_cls.label_for(encoding, source, checked["task"]),
                       seed=0 if seed is None else int(seed), device=device or "auto",
                       init=str(init) if init is not None else None, source=source, model=checked["model"],
                       encoding_options=checked["encoding"], train=checked["train"].to_dict(),
                       task_options=checked["task"], logs=list(logs))
    config.training = checked["train"]                  # the TrainConfig check_sections built: the run's own
    return config


def starting_point(task: str, encoding: str | None, preset: str | None, init: str | None = None,
                   init_flag: str = "--init") -> tuple:
    """What a run's settings start from, before the command line's: the task's class, the preset's name, the
    ``--init`` source, the encoding's name and class, the sections (the declared defaults, then the preset's, then
    the ``--init`` model's) and each section's limits."""
    from posbench.tasks.presets import preset_of

    task_cls = task_class(task)
    preset = preset or task_cls.default_preset
    chosen = preset_of(task_cls, preset)
    source = resolve_init(init, init_flag) if init is not None else None
    models = task_cls.model_source
    encoding = models.choose_encoding(encoding, source)
    encoding_cls = models.encodings().get(encoding) if encoding is not None else None
    sections: dict[str, dict[str, Any]] = {
        "model": model_defaults(),
        "encoding": encoding_cls.defaults() if encoding_cls is not None else {},
        "train": train_defaults(),
        "task": task_cls.defaults(),
    }
    limits = {"model": limits_of(model_options()), "train": limits_of(train_options()), "task": task_cls.limits(),
              "encoding": encoding_cls.limits() if encoding_cls is not None else {}}
    for name in ("model", "train", "task", "encoding"):
        apply_overrides(sections, {f"{name}.{k}": v for k, v in chosen.get(name, {}).items()},
                        origin=f"preset '{preset}' of task '{task}':", limits=limits)
    if getattr(encoding_cls, "trains", True) is False:     # a training-free method (ntk): no steps unless asked
        sections["train"]["steps"] = 0
    if source is not None:
        models.take_init(sections, source, task_cls.OPTIONS)
    return task_cls, preset, source, encoding, encoding_cls, sections, limits


def check_each_set(task: str, encoding: str | None, preset: str | None, sets: Sequence[str]) -> None:
    """Each ``--set`` entry of ``sets`` on its own, for a run of ``task`` and ``encoding`` at ``preset``: its key
    one of the run's, its value of the key's type and within the key's own range (``posbench check`` asks this
    before any check runs: a mistake of its ``--set`` is the user's, not the contract's); the first that is not,
    one line."""
    *_, sections, limits = starting_point(task, encoding, preset)
    for item in sets:
        raw_key, value = parse_assignment(item)
        (setting,) = read_settings(sections, [(raw_key, value)], limits=limits)
        where = raw_key if "." in raw_key else f"{setting.section}.{setting.key}"
        opts.check(where, setting.value, limits.get(setting.section, {}).get(setting.key))


def fill_task_context(task_cls: Any, encoding: str | None, encoding_cls: Any, sections: dict[str, dict[str, Any]],
                      assigned: set[tuple[str, str]] = frozenset()) -> None:
    """The encoding options only the task can give (those the encoding names in ``task_context``), from
    ``Task.encoding_context``, into the ``encoding`` section; one line when the task gives none of them (Abacus
    on a task whose tokens are not digits) or when ``--set`` names one (``assigned``: its (section, key)s)."""
    needed = tuple(getattr(encoding_cls, "task_context", ()))
    hints = tuple(getattr(encoding_cls, "task_hints", ()))
    if not needed and not hints:
        return
    for key in needed + hints:
        if ("encoding", key) in assigned:
            raise ConfigError(f"--set encoding.{key}: the task gives this option (its encoding_context), not --set")
    context = task_cls.encoding_context(dict(sections["task"]))
    sections["encoding"].update({key: context[key] for key in hints if key in context})
    missing = [key for key in needed if key not in context]
    if missing:
        from posbench.tasks import TASKS

        what = ", ".join(f"{key} ({encoding_cls.OPTIONS[key].help})" for key in missing)
        givers = [name for name in TASKS if TASKS[name].model_source.builds   # (a task building its own: none)
                  and all(key in TASKS[name].encoding_context(TASKS[name].defaults()) for key in needed)]
        raise ConfigError(f"encoding '{encoding}' needs {what}, which task '{task_cls.name}' does not give "
                          f"(tasks that do: {', '.join(givers) or 'none'})")
    sections["encoding"].update({key: context[key] for key in needed})


def check_sections(task_cls: Any, encoding_cls: Any, sections: dict[str, dict[str, Any]]) -> dict[str, dict]:
    """Every section through its one check, the one Python's constructors make too: ``ModelConfig``'s (the ranges
    and the head split), ``TrainConfig``'s (``train``: the ``TrainConfig`` itself, ``RunConfig.training``), the
    encoding's (or method's) with what it asks of the model (its attention backend; one pass of the blocks for an
    encoding that runs on one, TAPE), the task's."""
    from posbench.model import ModelConfig

    model = opts.resolve("model", model_defaults(), sections["model"], limits_of(model_options()), label="model.")
    ModelConfig(vocab_size=1, **model)
    train = train_config(sections["train"])
    encoding = encoding_cls.resolve(sections["encoding"]) if encoding_cls is not None else {}
    if encoding_cls is not None:
        from posbench.model.attention import check_encoding_backend
        from posbench.model.config import check_passes

        check_encoding_backend(model["attention"], encoding_cls.name, getattr(encoding_cls, "bias_from_qk", False))
        check_passes(encoding_cls.name, getattr(encoding_cls, "one_pass", False), model["recurrences"],
                     model["eval_recurrences"])
    task = task_cls.resolve(sections["task"])
    return {"model": model, "train": train, "encoding": encoding, "task": task}


def with_source(config: RunConfig) -> RunConfig:
    """A recorded config whose ``--init`` was stored by an older posbench as a path only: resolve it now."""
    if config.init is not None and config.source is None:
        config.source = resolve_init(config.init)
    return config


def check_recorded(config: RunConfig, where: str) -> None:
    """A recorded configuration (``config.json``, which ``--resume`` runs again) through the checks a new one goes
    through, each failure one line naming ``where``: its fields of their types, its sections objects holding only
    settings this posbench declares (a record of a newer posbench may hold others), and every section through
    ``check_sections`` and the task's ``adjust`` (on copies: the recorded values are what runs)."""
    import copy

    def refuse(what: str) -> ConfigError:
        return ConfigError(f"{where}: {what}; it cannot be run again as recorded")

    for name, kinds in (("task", str), ("preset", str), ("label", str), ("device", str),
                        ("encoding", (str, type(None))), ("init", (str, type(None)))):
        if not isinstance(getattr(config, name), kinds):
            raise refuse(f"'{name}' is {getattr(config, name)!r}, not a name")
    for name, low, high in (("seed", 0, MAX_SEED), ("task_version", 1, None)):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise refuse(f"'{name}' is {value!r}, not a whole number from {low}" + (f" to {high}" if high else ""))
    if not isinstance(config.logs, list) or not all(isinstance(log, str) for log in config.logs):
        raise refuse(f"'logs' is {config.logs!r}, not a list of names")
    if config.source is not None and not isinstance(config.source, InitSource):
        raise refuse(f"'source' is {str(config.source)[:60]!r}, not the object an --init run records")
    task_cls = task_class(config.task)
    if config.task_version != getattr(task_cls, "version", 1):
        raise refuse(f"it ran version {config.task_version} of task '{config.task}', and this posbench has version "
                     f"{getattr(task_cls, 'version', 1)} (docs/tasks.md); resume it with the posbench that started it")
    encoding_cls = (task_cls.model_source.encodings().get(config.encoding) if config.encoding is not None
                    else None)
    declared = {"model": model_options(), "train": train_options(),
                "encoding": opts.declared(encoding_cls) if encoding_cls is not None else {},
                "task": opts.declared(task_cls)}
    sections = {}
    for section, key in RECORDED_SECTIONS.items():
        values = getattr(config, key)
        if not isinstance(values, dict):
            raise refuse(f"'{key}' is {type(values).__name__} {str(values)[:60]}, not an object of settings")
        unknown = sorted(set(values) - set(declared[section]))
        if unknown:
            owner = f" of encoding '{config.encoding}'" if section == "encoding" else ""
            raise refuse(f"{', '.join(f'{section}.{k}' for k in unknown)} is not a setting{owner} this posbench "
                         f"declares (a record of a newer posbench, or edited?)")
        sections[section] = copy.deepcopy(values)
    try:
        check_sections(task_cls, encoding_cls, sections)
        task_cls.adjust(copy.deepcopy(sections), config.source)
    except ConfigError as exc:
        raise refuse(str(exc)) from None
