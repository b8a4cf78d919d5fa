"""A run's configuration, ``RunConfig`` (what config.json records), and the one precedence that builds it,
``resolve_run_config``: the declared defaults < the task's preset < the ``--init`` model < the typed ``settings``
(the flags) < the ``sets`` text (``--set section.key=value``, or a bare ``key=value`` when one section alone has the
key) < the task's adjustments and the encoding options only the task gives; then every section through its one
check. A flag or ``--set`` is never overruled in silence: one the task's adjustments would change
(``Task.follows``), or a model setting an ``--init`` model would not build, is refused. The sections are
``posbench.options``'s; ``model`` lacks ``vocab_size`` and ``encoding`` (the task and ``--encoding`` set them).
Errors are one line (``ConfigError``).
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from posbench import options as opts
from posbench.bench import Bench
from posbench.errors import ConfigError
from posbench.loggers import validate
from posbench.model.attention import check_encoding_backend
from posbench.model.config import RENAMED, ModelConfig, check_passes, current_names
from posbench.options import ONE_ENCODING, RECORDED_SECTIONS, SECTIONS, SYNONYMS, Option, Setting
from posbench.runs.init import InitSource, resolve_init
from posbench.runs.run_config import RunConfig
from posbench.tasks import TASKS
from posbench.tasks.presets import preset_of
from posbench.train.config import TrainConfig

__all__ = ["ConfigError", "RunConfig", "Setting", "resolve_run_config", "with_source", "RECORDED_SECTIONS"]

MAX_SEED = 2**32 - 1                    # NumPy's seeds: 0 .. 2**32 - 1
MODEL_KEYS_EXCLUDED = ("vocab_size", "encoding", "encoding_options")
#: the model settings an ``--init`` model (extend's ``--model``) takes from the flags: its attention backend, the
#: training length its task evaluates from, and (a posbench model) its passes at evaluation; the rest, its
#: architecture, is its own
INIT_READS = ("attention", "max_seq_len", "eval_recurrences")
PRETRAINED_READS = ("attention", "max_seq_len")


BENCH = "bench"


def task_class(name: str) -> Any:
    """The class that declares a run's ``task`` section: a task of ``TASKS``, or bench's ``Bench`` (runs of task
    ``bench``)."""
    return Bench if name == BENCH else TASKS.get(name)


def model_options() -> dict[str, Option]:
    return {k: o for k, o in opts.declared(ModelConfig).items() if k not in MODEL_KEYS_EXCLUDED}


def section_options(task_cls: Any, encoding_cls: Any = None) -> dict[str, dict[str, Option]]:
    """Each section's declarations for a run of ``task_cls`` with ``encoding_cls`` (either None: none)."""
    return {"model": model_options(), "encoding": opts.declared(encoding_cls) if encoding_cls is not None else {},
            "train": opts.declared(TrainConfig), "task": opts.declared(task_cls) if task_cls is not None else {}}


def defaults(options: dict[str, Option]) -> dict[str, Any]:
    return {k: o.default for k, o in options.items()}


def model_defaults() -> dict[str, Any]:
    return defaults(model_options())


def train_defaults() -> dict[str, Any]:
    return defaults(opts.declared(TrainConfig))


def parse_assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    return key, value.strip()


def read_settings(sections: dict[str, dict[str, Any]], given: Sequence[tuple[str, Any]], origin: str = "--set",
                  options: dict[str, dict[str, Option]] | None = None) -> list[Setting]:
    """``(section.key or key, value)`` pairs as ``Setting``s, each key located (``locate_key``), each value typed."""
    found = []
    for raw_key, value in given:
        section, key = locate_key(sections, raw_key, origin)
        where = raw_key if "." in raw_key else f"{section}.{key}"       # as written (method.r is encoding.r)
        option = (options or {}).get(section, {}).get(key)
        found.append(Setting(section, key, opts.typed(where, value, sections[section][key],
                                                      option.limit if option is not None else None)))
    return found


def apply_settings(sections: dict[str, dict[str, Any]], settings: Sequence[Setting]) -> None:
    """The typed ``settings`` onto ``sections``, in order (of one key given twice, the last wins)."""
    for setting in settings:
        if setting.key not in sections.get(setting.section, {}):
            raise ConfigError(f"{setting.section}.{setting.key}: unknown setting")
        sections[setting.section][setting.key] = setting.value


def locate_key(sections: dict[str, dict[str, Any]], raw_key: str, origin: str = "--set") -> tuple[str, str]:
    if "." in raw_key:
        section, key = raw_key.split(".", 1)
        section = SYNONYMS.get(section, section)
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


def resolve_run_config(task: str, encoding: str | None, preset: str | None = None, *,
                       seed: int | None = None, device: str | None = None, init: str | None = None,
                       settings: Sequence[Setting] = (), sets: Sequence[str] = (),
                       logs: list[str] | tuple[str, ...] = (), init_flag: str = "--init") -> RunConfig:
    if seed is not None and not 0 <= int(seed) <= MAX_SEED:
        raise ConfigError(f"--seed {seed}: a seed must be between 0 and {MAX_SEED} (NumPy's range)")
    task_cls, preset, source, encoding, encoding_cls, sections, options = starting_point(task, encoding, preset,
                                                                                          init, init_flag)
    given = [*for_encoding(settings, encoding, sections["encoding"], task_cls.model_source.encodings()),
             *read_settings(sections, [parse_assignment(item) for item in sets], options=options)]
    apply_settings(sections, given)
    last = {(s.section, s.key): s.value for s in given}          # each setting given: its last value
    refuse_unused(source, last, init_flag)
    task_cls.adjust(sections, source)
    refuse_followed(task_cls, last, sections)
    fill_task_context(task_cls, encoding, encoding_cls, sections, {(s.section, s.key) for s in given})
    checked = check_sections(task_cls, encoding_cls, sections)
    return RunConfig(task=task, encoding=encoding, preset=preset, task_version=task_cls.version,
                     label=task_cls.label_for(encoding, source, checked["task"]),
                     seed=0 if seed is None else int(seed), device=device or "auto",
                     init=str(init) if init is not None else None, source=source, model=checked["model"],
                     encoding_options=checked["encoding"], train=checked["train"].to_dict(),
                     task_options=checked["task"], logs=validate(logs) if logs else [])


def for_encoding(settings: Sequence[Setting], encoding: str | None, keys: Any, registry: Any) -> list[Setting]:
    """Of the flags' settings for every chosen encoding, this run's: an ``encoding`` one of a key it declares
    (``keys``; ``--theta`` with ``-e rope,alibi``: RoPE's) or that no encoding of ``registry`` declares (refused
    later as unknown), an ``encoding:NAME`` one of this encoding, every other."""
    kept = []
    for setting in settings:
        if setting.section.startswith(ONE_ENCODING):
            if setting.section != ONE_ENCODING + str(encoding):
                continue
            setting = setting._replace(section="encoding")
        elif setting.section == "encoding" and setting.key not in keys and \
                any(setting.key in opts.declared(registry[name]) for name in registry):
            continue
        kept.append(setting)
    return kept


def refuse_unused(source: InitSource | None, given: dict[tuple[str, str], Any], init_flag: str) -> None:
    """Model settings given (``(section, key)`` -> value) for an ``--init`` model that it would not build: its
    architecture is its own (``INIT_READS``; a pretrained model's, ``PRETRAINED_READS``)."""
    if source is None:
        return
    own = current_names(source.model) if source.is_posbench else {}
    reads = INIT_READS if source.is_posbench else PRETRAINED_READS
    unused = [f"model.{key}={value!r}" + (f" (its {own[key]!r})" if key in own else "")
              for (section, key), value in given.items()
              if section == "model" and key not in reads and (key not in own or own[key] != value)]
    if unused:
        what = "a posbench model" if source.is_posbench else f"a pretrained {source.label} model"
        raise ConfigError(f"{init_flag} {source.given} is {what} of its own architecture: {', '.join(unused)} "
                          f"would be recorded and not built; leave {'it' if len(unused) == 1 else 'them'} out")


def refuse_followed(task_cls: Any, given: dict[tuple[str, str], Any], sections: dict[str, dict[str, Any]]) -> None:
    """A setting given (``(section, key)`` -> value) that the task's ``adjust`` set from another (``Task.follows``)."""
    for (section, key), value in given.items():
        follows = task_cls.follows.get(f"{section}.{key}")
        if follows and as_recorded(sections[section][key]) != as_recorded(value):
            raise ConfigError(f"{section}.{key}={value!r}: task '{task_cls.name}' sets it from {follows} (to "
                              f"{sections[section][key]!r} here); leave it out, or set {follows}")


class Start(NamedTuple):
    """What a run's settings start from, before the command line's: the sections' values (defaults < preset <
    ``--init`` model) and their declarations."""

    task_cls: Any
    preset: str
    source: InitSource | None
    encoding: str | None
    encoding_cls: Any
    sections: dict[str, dict[str, Any]]
    options: dict[str, dict[str, Option]]


def starting_point(task: str, encoding: str | None, preset: str | None, init: str | None = None,
                   init_flag: str = "--init") -> Start:
    """The ``Start`` of a run of ``task`` with ``encoding`` from ``preset`` (None: the task's) and ``init``."""
    task_cls = task_class(task)
    preset = task_cls.default_preset if preset is None else preset
    chosen = preset_of(task_cls, preset)
    source = resolve_init(init, init_flag) if init is not None else None
    models = task_cls.model_source
    encoding = models.choose_encoding(encoding, source)
    encoding_cls = models.encodings().get(encoding) if encoding is not None else None
    options = section_options(task_cls, encoding_cls)
    sections = {section: defaults(declared) for section, declared in options.items()}
    apply_settings(sections, read_settings(sections, [(f"{name}.{k}", v) for name in SECTIONS
                                                      for k, v in chosen.get(name, {}).items()],
                                           f"preset '{preset}' of task '{task}':", options))
    if getattr(encoding_cls, "trains", True) is False:     # a training-free method (ntk): no steps unless asked
        sections["train"]["steps"] = 0
    if source is not None:
        models.take_init(sections, source, task_cls.OPTIONS)
    return Start(task_cls, preset, source, encoding, encoding_cls, sections, options)


def check_each_set(task: str, encoding: str | None, preset: str | None, sets: Sequence[str]) -> None:
    """Each ``--set`` entry alone: a key of the run's, a value of its type and range (``posbench check`` asks first:
    a mistake of its ``--set`` is the user's, not the contract's)."""
    start = starting_point(task, encoding, preset)
    sections, options = start.sections, start.options
    for item in sets:
        raw_key, value = parse_assignment(item)
        (setting,) = read_settings(sections, [(raw_key, value)], options=options)
        where = raw_key if "." in raw_key else f"{setting.section}.{setting.key}"
        opts.check(where, setting.value, options[setting.section][setting.key].limit)


def fill_task_context(task_cls: Any, encoding: str | None, encoding_cls: Any, sections: dict[str, dict[str, Any]],
                      assigned: set[tuple[str, str]] = frozenset()) -> None:
    """The encoding options only the task gives (``task_context``; ``task_hints`` where it has them), from
    ``Task.encoding_context``; refused when the task lacks one or ``--set`` gave one (``assigned``)."""
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
        what = ", ".join(f"{key} ({encoding_cls.OPTIONS[key].help})" for key in missing)
        givers = [name for name in TASKS if TASKS[name].model_source.builds   # (a task building its own: none)
                  and all(key in TASKS[name].encoding_context(TASKS[name].defaults()) for key in needed)]
        raise ConfigError(f"encoding '{encoding}' needs {what}, which task '{task_cls.name}' does not give "
                          f"(tasks that do: {', '.join(givers) or 'none'})")
    sections["encoding"].update({key: context[key] for key in needed})


def check_sections(task_cls: Any, encoding_cls: Any, sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every section through its one check, the constructors' own (``ModelConfig``, ``TrainConfig``: ``train`` is
    one), the encoding's with what it asks of the model (attention backend, one pass), the task's."""
    model = opts.resolve("model", model_options(), sections["model"], label="model.")
    ModelConfig(vocab_size=1, **model)
    train = TrainConfig(**sections["train"])
    encoding = encoding_cls.resolve(sections["encoding"]) if encoding_cls is not None else {}
    if encoding_cls is not None:
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
    """A recorded config (``--resume``) through a new one's checks, each failure one line naming ``where``: field
    types, the encoding its model has, sections holding every declared setting and no other, each as a run records
    it (``"5"`` is not ``5``), ``check_sections`` and ``adjust`` (on copies), the label the run's names make."""
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
    try:
        encoding = task_cls.model_source.choose_encoding(config.encoding, config.source)
    except ConfigError as exc:
        raise refuse(f"'encoding' is {config.encoding!r}: {exc}") from None
    if encoding != config.encoding:
        raise refuse(f"'encoding' is {config.encoding!r}, and its model's is {encoding!r}")
    encoding_cls = task_cls.model_source.encodings().get(encoding) if encoding is not None else None
    declared = section_options(task_cls, encoding_cls)
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
        checked = check_sections(task_cls, encoding_cls, sections)
        task_cls.adjust(copy.deepcopy(sections), config.source)
    except ConfigError as exc:
        raise refuse(str(exc)) from None
    checked["train"] = checked["train"].to_dict()
    for section, values in checked.items():         # every setting recorded, each as a run records it
        for key, value in values.items():
            if key not in sections[section]:
                raise refuse(f"it lacks {section}.{key}")
            if as_recorded(sections[section][key]) != as_recorded(value):
                raise refuse(f"{section}.{key} is {sections[section][key]!r}, where a run records {value!r}")
    label = task_cls.label_for(encoding, config.source, checked["task"])
    if config.label != label:
        raise refuse(f"'label' is {config.label!r}, where its encoding and model make it {label!r}")


def as_recorded(value: Any) -> str:
    """A value as config.json writes it: its JSON text (``5``, ``5.0`` and ``"5"`` differ)."""
    return json.dumps(value, sort_keys=True)
