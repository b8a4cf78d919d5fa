"""The Hugging Face side of data loading in one place: whether the hub is marked offline, what to tell a user
who has no network, and the ``datasets`` library (imported on first use, its progress bars following
``posbench.data.progress``)."""

from __future__ import annotations

import os

from posbench.data.progress import apply_to

WHAT_TO_PASS = ("pass a local copy with --data PATH (a .jsonl/.json/.parquet/.txt file or a directory of "
                "them, one document per row in a 'text' field) or use the built-in corpus with --data stdlib")


def hub_offline() -> bool:
    """True when the environment marks the Hugging Face hub offline (checked before any network call)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    try:
        from huggingface_hub import constants  # huggingface_hub: only when no variable says offline
        return bool(constants.HF_HUB_OFFLINE)
    except Exception:       # noqa: BLE001 - an old or missing huggingface_hub just means "not flagged"
        return False


def datasets_library():
    """``datasets``, imported on first use (it is heavy); its progress bars follow
    :func:`posbench.data.progress.library_progress`, its warnings stay quiet."""
    import datasets  # datasets: heavy, only hub data needs it

    return apply_to(datasets)
