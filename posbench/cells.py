"""A run's settings as flat cells, one per ``section.key``: the columns of ``posbench.results.frame`` and the
hyperparameters TensorBoard shows, named and written alike."""

from __future__ import annotations

from typing import Any

#: ``RunConfig`` sections (as ``RunConfig.to_dict`` names them) -> the column prefixes
PREFIXES = {"model": "model", "encoding_options": "encoding", "train": "train", "task_options": "task"}


def cell(value: Any) -> Any:
    """A setting as one cell: lists and dicts as text (``"1,2,4,8"``), so that columns group and compare."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return value
