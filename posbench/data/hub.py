"""Hub data sets by name: which files ``datasets`` 4+ reads for each alias, and how.

Since ``datasets`` 4.0 a hub repository that holds a loading script (``<name>.py``) cannot be loaded
(``RuntimeError: Dataset scripts are no longer supported``). Several corpora the long-context literature uses
live in such repositories; posbench therefore never loads them by name but reads **data files** with
``datasets``' own ``json`` / ``parquet`` builders in streaming mode, file by file, in a fixed order:

==============================  =============================================  ==========================================
``--data``                      what is read                                   splits (held-out split)
==============================  =============================================  ==========================================
``c4``, ``allenai/c4[:en]``     ``allenai/c4`` (a data-file repository):       train: 1024 shards; validation: 8 shards
                                ``en/c4-train.*-of-01024.json.gz``,
                                ``en/c4-validation.*-of-00008.json.gz``
``pg19``, ``deepmind/pg19``     ``emozilla/pg19``, a parquet copy of PG-19     train, validation (50 books), test
                                (``deepmind/pg19`` is a script repository):
                                ``data/{train,validation,test}-*.parquet``
``proof-pile``,                 the ``.jsonl.gz`` files of the script          train: 21 files; validation:
``hoskinson-center/proof-pile`` repository ``hoskinson-center/proof-pile``     ``dev/proofpile_dev.jsonl.gz``; test
                                itself: ``train/proofpile_train_*.jsonl.gz``
``redpajama-sample``,           the ``*.jsonl`` files of the script            train only: every ``holdout_every``-th
``togethercomputer/RedPajama-`` repository itself (arxiv, book, c4, cc,        document (0, 20, 40, ...) is held out;
``Data-1T-Sample``              github, stackexchange, wikipedia samples),     the files are interleaved in proportion
                                                                               to their sizes (not read one after the
                                                                               other: arxiv first would be a curriculum)
==============================  =============================================  ==========================================

Any other ``owner/name[:config]`` is loaded with ``datasets.load_dataset(name, config, streaming=True)``: it
must be a repository with data files (parquet, json, csv, text...). A script repository fails with a one-line
error that says so (:mod:`posbench.data.hub_errors`). ``tau/scrolls`` (a script repository with one zip per
data set) is read by the ``scrolls`` task through :mod:`posbench.tasks.scrolls.data`, not as a text corpus.

``HUB_ROOT`` is where repositories are found: ``hf://datasets`` (huggingface_hub's fsspec file system), or
``$POSBENCH_HUB_ROOT`` when set: a local mirror in the hub's layout (``ROOT/allenai/c4/en/...``, e.g. made with
``hf download REPO --repo-type dataset --local-dir ROOT/REPO``), read without a network. Tests point it at
stand-ins, so that the very same reading code runs offline.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from posbench.data.hub_env import datasets_library

HUB_ROOT = os.environ.get("POSBENCH_HUB_ROOT") or "hf://datasets"

#: repositories that hold a loading script, which ``datasets`` >= 4 refuses, and what posbench reads instead
SCRIPT_REPOS: dict[str, str] = {
    "deepmind/pg19": "the parquet copy emozilla/pg19",
    "pg19": "the parquet copy emozilla/pg19",
    "hoskinson-center/proof-pile": "its .jsonl.gz data files",
    "togethercomputer/redpajama-data-1t-sample": "its .jsonl data files",
    "tau/scrolls": "its per-data-set zip files (the scrolls task)",
}


@dataclass(frozen=True)
class HubSpec:
    """How one hub data set is read. ``builder`` None: ``load_dataset(repo, config)`` (a data-file repository);
    otherwise ``builder`` over ``data_files`` (split -> glob patterns inside the repository)."""

    name: str                                   # the canonical name recorded with the run
    repo: str                                   # the repository whose files are read
    config: str | None = None
    builder: str | None = None                  # json | parquet | None
    data_files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    text_field: str = "text"
    interleave: bool = False                    # read the files interleaved by size instead of one by one
    note: str = ""

    @property
    def splits(self) -> tuple[str, ...] | None:
        """The splits the files define (None: ask the hub, for a repository read by name)."""
        return tuple(self.data_files) if self.builder else None

    def patterns(self, split: str) -> list[str]:
        return [f"{HUB_ROOT.rstrip('/')}/{self.repo}/{p}" for p in self.data_files.get(split, ())]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hub_name": self.name, "repository": self.repo, "hub_config": self.config}
        if self.builder:
            out.update(builder=self.builder, data_files={s: list(p) for s, p in self.data_files.items()},
                       file_order="interleaved by size" if self.interleave else "sorted by name")
        if self.note:
            out["note"] = self.note
        return out


_C4 = HubSpec("allenai/c4:en", "allenai/c4", "en", "json",
              {"train": ("en/c4-train.*-of-01024.json.gz",), "validation": ("en/c4-validation.*-of-00008.json.gz",)})
_PG19 = HubSpec("emozilla/pg19", "emozilla/pg19", None, "parquet",
                {"train": ("data/train-*.parquet",), "validation": ("data/validation-*.parquet",),
                 "test": ("data/test-*.parquet",)},
                note="deepmind/pg19 is a script repository; its parquet copy emozilla/pg19 is read")
_PROOF_PILE = HubSpec("hoskinson-center/proof-pile", "hoskinson-center/proof-pile", None, "json",
                      {"train": ("train/proofpile_train_*.jsonl.gz",), "validation": ("dev/proofpile_dev.jsonl.gz",),
                       "test": ("test/proofpile_test.jsonl.gz",)},
                      note="a script repository; its data files are read with the json builder")
_REDPAJAMA = HubSpec("togethercomputer/RedPajama-Data-1T-Sample", "togethercomputer/RedPajama-Data-1T-Sample",
                     None, "json", {"train": ("*.jsonl",)}, interleave=True,
                     note="a script repository; its data files are read with the json builder, interleaved by size; "
                          "it has no validation split")

#: every name posbench resolves itself (lower case), aliases and canonical names alike
KNOWN: dict[str, HubSpec] = {
    "c4": _C4, "c4:en": _C4, "allenai/c4": _C4, "allenai/c4:en": _C4,
    "pg19": _PG19, "deepmind/pg19": _PG19, "emozilla/pg19": _PG19,
    "proof-pile": _PROOF_PILE, "proofpile": _PROOF_PILE, "hoskinson-center/proof-pile": _PROOF_PILE,
    "redpajama-sample": _REDPAJAMA, "togethercomputer/redpajama-data-1t-sample": _REDPAJAMA,
}
#: the short names (``--data c4``) the README and the help texts list
ALIASES = ("c4", "pg19", "proof-pile", "redpajama-sample")


def resolve(spec: str) -> HubSpec:
    """``--data`` hub name -> how it is read: a known name (alias or canonical) or any ``owner/name[:config]``."""
    key = spec.strip().lower()
    if key in KNOWN:
        return KNOWN[key]
    name, _, config = spec.strip().partition(":")
    if name.lower() in KNOWN and KNOWN[name.lower()].config in (None, config):
        return KNOWN[name.lower()]
    return HubSpec(spec.strip(), name, config or None, None)


def _natural(path: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def list_files(pattern: str) -> list[tuple[str, int]]:
    """``(url, size in bytes)`` of the files a glob pattern matches, in natural name order (``_2`` before
    ``_10``); an ``hf://`` pattern lists the hub repository (network), anything else the local file system."""
    import fsspec  # fsspec (with datasets): only a file listing needs it

    fs, path = fsspec.core.url_to_fs(pattern)
    found = fs.glob(path, detail=True)
    items = sorted(found.items(), key=lambda kv: _natural(kv[0]))
    return [(fs.unstrip_protocol(p) if "://" in pattern else p, int(info.get("size") or 0))
            for p, info in items if info.get("type", "file") == "file"]


def split_names(spec: HubSpec) -> tuple[str, ...]:
    """The splits of a hub data set (static for the known ones; asks the hub otherwise)."""
    if spec.splits is not None:
        return spec.splits
    return tuple(datasets_library().get_dataset_split_names(spec.repo, spec.config))
