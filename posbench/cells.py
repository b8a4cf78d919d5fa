"""A run's settings as flat cells, one per ``section.key``: the columns of ``posbench.results.frame`` and the
hyperparameters TensorBoard shows, named and written alike."""

from __future__ import annotations

from typing import Any

from posbench.options import RECORDED_SECTIONS, SECTIONS

#: the fields of a run's record (``RunConfig.to_dict``) -> the column prefixes, their sections
PREFIXES = {RECORDED_SECTIONS[section]: section for section in SECTIONS}


def cell(value: Any) -> Any:
    """A setting as one cell: lists and dicts as text (``"1,2,4,8"``), so that columns group and compare."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return value


def resolved(run: Any) -> dict[str, dict[str, Any]]:
    """The run's settings by section, the model's and the encoding's as the built model used them (the record's
    ``model_config``: posbench's ``ModelConfig``, or a Hugging Face model's method options)."""
    sections = {section: dict(run.config.section(section)) for section in SECTIONS}
    built = run.model_config or {}
    sections["model"].update({k: v for k, v in built.items() if k in sections["model"]})
    options = built.get("encoding_options") if "encoding_options" in built else built.get("method_options")
    if isinstance(options, dict):
        sections["encoding"].update(options)
    return sections


def flat(run: Any) -> dict[str, Any]:
    """``resolved(run)`` as one dict of ``section.key`` -> value."""
    return flattened(resolved(run))


def flattened(sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Settings by section as one dict of ``section.key`` -> value."""
    return {f"{section}.{key}": value for section, values in sections.items() for key, value in values.items()}
