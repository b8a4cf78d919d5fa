"""The resolved configuration of one run: sections, presets and ``--set key=value`` overrides.

A run's configuration has four sections, each a flat dict of typed keys:

- ``model``: ``ModelConfig`` fields (``d_model``, ``n_layers``, ``n_heads``, ``d_ff``, ``max_seq_len``,
  ``attention``, ...). ``vocab_size`` and ``encoding`` are not keys: the task and ``--encoding`` set them.
- ``encoding``: the chosen encoding's options (its ``defaults``), e.g. ``encoding.theta=500``.
- ``train``: ``TrainConfig`` fields (``steps``, ``batch_size``, ``lr``, ``warmup_ratio``, ...).
- ``task``: the task's own ``options`` (e.g. ``task.train_digits=6``, ``task.data=PATH``).

Resolution order: built-in defaults, then the task's preset, then flags (``--steps``...), then ``--set``.
Every key is type-checked against its default; ``--set`` accepts ``section.key=value`` or a bare
``key=value`` when the key exists in exactly one section. Errors are ``ConfigError`` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from posbench.errors import ConfigError

__all__ = ["ConfigError", "RunConfig", "resolve_run_config", "coerce", "apply_overrides"]

SECTIONS = ("model", "encoding", "train", "task")
# ModelConfig fields a user may set; the task provides vocab_size, --encoding provides the encoding
MODEL_KEYS_EXCLUDED = ("vocab_size", "encoding", "encoding_options")


@dataclass
class RunConfig:
    """Everything needed to reproduce a run (written to ``config.json`` and ``result.json``)."""

    task: str
    encoding: str
    preset: str
    seed: int = 0
    device: str = "auto"
    init: str | None = None                 # another run's directory whose weights this run starts from
    model: dict[str, Any] = field(default_factory=dict)
    encoding_options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    task_options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"task", "encoding", "preset"} - set(data)
        if missing:
            raise ConfigError(f"run config lacks {', '.join(sorted(missing))}")
        return cls(**{k: v for k, v in data.items() if k in names})

    def section(self, name: str) -> dict[str, Any]:
        return {"model": self.model, "encoding": self.encoding_options, "train": self.train,
                "task": self.task_options}[name]


def coerce(key: str, value: Any, default: Any) -> Any:
    """Convert ``value`` (often a string from the command line) to the type of ``default``."""
    if value is None:
        return None
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "false", "1", "0", "yes", "no", "on", "off"}:
            return value.lower() in {"true", "1", "yes", "on"}
        raise ConfigError(f"{key}={value!r}: expected true or false")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={value!r}: expected an integer") from None
        if not number.is_integer():
            raise ConfigError(f"{key}={value!r}: expected an integer")
        return int(number)
    if isinstance(default, float):
        if isinstance(value, bool):
            raise ConfigError(f"{key}={value!r}: expected a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={value!r}: expected a number") from None
    if isinstance(default, (list, tuple)):
        items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value)
        if default:
            items = [coerce(key, item.strip() if isinstance(item, str) else item, default[0]) for item in items]
        return list(items)
    if isinstance(default, str) or default is None:
        return value if isinstance(value, str) else str(value) if default is not None else value
    if isinstance(value, type(default)):
        return value
    raise ConfigError(f"{key}={value!r}: expected {type(default).__name__}")


def parse_assignment(text: str) -> tuple[str, str]:
    """``"key=value"`` -> ``("key", "value")``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    return key, value.strip()


def apply_overrides(sections: dict[str, dict[str, Any]], overrides: dict[str, Any],
                    origin: str = "--set") -> None:
    """Apply ``{"section.key" or "key": value}`` onto ``sections`` in place, type-checked."""
    for raw_key, value in overrides.items():
        section, key = locate_key(sections, raw_key, origin)
        sections[section][key] = coerce(f"{section}.{key}", value, sections[section][key])


def locate_key(sections: dict[str, dict[str, Any]], raw_key: str, origin: str = "--set") -> tuple[str, str]:
    if "." in raw_key:
        section, key = raw_key.split(".", 1)
        if section not in sections:
            raise ConfigError(f"{origin} {raw_key}: unknown section '{section}'; sections: {', '.join(SECTIONS)}")
        if key not in sections[section]:
            raise ConfigError(f"{origin} {raw_key}: unknown key{_hint(key, sections[section])}; "
                              f"{section} keys: {', '.join(sorted(sections[section])) or 'none'}")
        return section, key
    owners = [name for name, values in sections.items() if raw_key in values]
    if len(owners) == 1:
        return owners[0], raw_key
    if len(owners) > 1:
        raise ConfigError(f"{origin} {raw_key}: ambiguous, say which: "
                          f"{', '.join(f'{o}.{raw_key}' for o in owners)}")
    everything = [f"{s}.{k}" for s, values in sections.items() for k in values]
    bare = {k: f"{s}.{k}" for s, values in sections.items() for k in values}
    close = difflib.get_close_matches(raw_key, list(bare), n=1, cutoff=0.6)
    hint = f" Did you mean '{bare[close[0]]}'?" if close else ""
    raise ConfigError(f"{origin} {raw_key}: unknown key.{hint} Run 'posbench ls presets' for the keys "
                      f"({len(everything)} in all)")


def _hint(key: str, values: dict[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(values), n=1, cutoff=0.6)
    return f" '{key}' (did you mean '{close[0]}'?)" if close else f" '{key}'"


# ---- resolution ------------------------------------------------------------------------------------------

#: generic ``posbench run`` flags that set a task option of the same name (``--data PATH`` -> ``task.data``)
TASK_FLAGS = ("data", "datasets", "tokenizer")


def model_defaults() -> dict[str, Any]:
    from posbench.model import ModelConfig

    return {f.name: f.default for f in dataclasses.fields(ModelConfig)
            if f.name not in MODEL_KEYS_EXCLUDED and f.default is not dataclasses.MISSING}


def train_defaults() -> dict[str, Any]:
    from posbench.engine import TrainConfig

    return TrainConfig().to_dict()


def resolve_run_config(task: str, encoding: str | None, preset: str | None = None, *, steps: int | None = None,
                       seed: int | None = None, device: str | None = None, init: str | None = None,
                       sets: list[str] | tuple[str, ...] = (), task_flags: dict[str, Any] | None = None
                       ) -> RunConfig:
    """Defaults -> the task's preset -> ``--init`` architecture -> flags -> ``--set``; everything type-checked."""
    from posbench.encodings import ENCODINGS
    from posbench.hf.runs import HFModelEncoding
    from posbench.tasks import TASKS

    task_cls = TASKS.get(task)
    preset = preset or task_cls.default_preset
    chosen = task_cls.preset(preset)
    unknown_sections = sorted(set(chosen) - {"model", "train", "task", "encoding", "expected"})
    if unknown_sections:
        raise ConfigError(f"preset '{preset}' of task '{task}' has unknown sections {unknown_sections}")
    model = model_defaults()
    init_options: dict[str, Any] | None = None
    if init is not None:
        init_model = read_init_model_config(init)
        init_encoding = init_model.get("encoding")
        if encoding is not None and encoding != init_encoding:
            raise ConfigError(f"--init run {init} uses encoding '{init_encoding}', not '{encoding}'")
        encoding = init_encoding
        init_options = dict(init_model.get("encoding_options") or {})
    if encoding is None:
        raise ConfigError("--encoding is required (or --init RUN_DIR to take it from another run)")
    hf_init = init is not None and read_init_model_config(init).get("hf", False)
    encoding_cls = HFModelEncoding if hf_init else ENCODINGS.get(encoding)   # a Hugging Face --init: no options
    sections: dict[str, dict[str, Any]] = {
        "model": model,
        "encoding": dict(encoding_cls.defaults),
        "train": train_defaults(),
        "task": dict(task_cls.options),
    }
    for name in ("model", "train", "task", "encoding"):
        apply_overrides(sections, {f"{name}.{k}": v for k, v in chosen.get(name, {}).items()},
                        origin=f"preset '{preset}' of task '{task}':")
    if init is not None:
        init_model = read_init_model_config(init)
        for key in sections["model"]:
            if key in init_model:
                sections["model"][key] = init_model[key]
        sections["encoding"].update({k: v for k, v in (init_options or {}).items() if k in sections["encoding"]})
        if "tokenizer" in sections["task"]:       # the init run's tokenizer; a preset's is for runs from scratch
            sections["task"]["tokenizer"] = task_cls.options["tokenizer"]
    if steps is not None:
        apply_overrides(sections, {"train.steps": steps}, origin="--steps")
    for flag, value in (task_flags or {}).items():
        if value is None:
            continue
        if flag not in sections["task"]:
            raise ConfigError(f"task '{task}' takes no --{flag} option")
        apply_overrides(sections, {f"task.{flag}": value}, origin=f"--{flag}")
    parsed = dict(parse_assignment(item) for item in sets)
    apply_overrides(sections, parsed)
    _check_train(sections["train"])
    _check_model(sections["model"])
    _check_encoding(encoding_cls, sections["encoding"])
    return RunConfig(task=task, encoding=encoding, preset=preset, seed=0 if seed is None else int(seed),
                     device=device or "auto", init=str(init) if init is not None else None,
                     model=sections["model"], encoding_options=sections["encoding"], train=sections["train"],
                     task_options=sections["task"])


def read_init_model_config(init: str) -> dict[str, Any]:
    from pathlib import Path

    from posbench.hf.runs import init_model_config
    from posbench.results import read_json

    hf = init_model_config(init)           # an extend run or a local Llama directory (posbench.hf)
    if hf is not None:
        return hf
    run = Path(init)
    if not run.is_dir():
        raise ConfigError(f"--init {init}: no such run directory")
    path = run / "checkpoint" / "model_config.json"
    if not path.is_file():
        raise ConfigError(f"--init {init}: no checkpoint/model_config.json there (did that run finish training?)")
    return read_json(path, missing=f"--init {init}: no {path.name}", error=ConfigError,
                     unreadable=f"--init {init}: cannot read {path.name}: {{reason}}")


def _check_train(train: dict[str, Any]) -> None:
    from posbench.engine import TrainConfig

    try:
        TrainConfig(**train)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for key in ("batch_size", "lr"):
        if train[key] <= 0:
            raise ConfigError(f"train.{key} must be positive, got {train[key]}")


def _check_encoding(encoding_cls: Any, options: dict[str, Any]) -> None:
    """Types, valid ranges and constraints of the encoding's options, before any run directory exists."""
    encoding_cls.resolve(options)


def _check_model(model: dict[str, Any]) -> None:
    for key in ("d_model", "n_layers", "n_heads"):
        if model[key] <= 0:
            raise ConfigError(f"model.{key} must be positive, got {model[key]}")
    if model["max_seq_len"] < 0:
        raise ConfigError(f"model.max_seq_len must be >= 0 (0: the task decides), got {model['max_seq_len']}")
    if model["d_model"] % model["n_heads"] or (model["d_model"] // model["n_heads"]) % 2:
        raise ConfigError(f"model.d_model {model['d_model']} must split into {model['n_heads']} heads of even size")
