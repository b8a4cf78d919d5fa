"""Text sources named by ``--data SOURCE``: the built-in corpus, a hub name, or local files.

Every source yields documents (strings) for a split (``train`` or ``validation``) in the same schema: one
document per row in a text field (``text`` unless told otherwise). Kinds:

* ``stdlib`` (the default): the built-in corpus of ``posbench.data.corpus``; no download.
* a local path: a ``.jsonl``/``.json``/``.parquet`` file (one row per document), a ``.txt``/``.md`` file
  (one document per file), each optionally compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``), or a directory
  of them (searched recursively, sorted by path). Files named ``validation``, ``valid``, ``val``, ``dev``,
  ``test`` (a word of the name before its first ``.``, words split at ``-`` and ``_``: ``validation.jsonl``,
  ``c4-validation.00000-of-00008.json.gz``), or that sit under a directory of that name, form the held-out
  split; when there are none, every ``holdout_every``-th document is held out (indices 0, k, 2k, ...).
* a hub name: an alias (``c4``, ``pg19``, ``proof-pile``, ``redpajama-sample``), a canonical name
  (``allenai/c4:en``, ``deepmind/pg19``, ...) or any ``owner/name[:config]`` of a repository with data files,
  read with ``datasets`` in streaming mode when a network is there (:mod:`posbench.data.hub` says which files
  each name reads and why). A data set without a validation split holds out every ``holdout_every``-th
  training document. Offline the source raises a one-line :class:`DataError` that says what to pass instead.

Every file is read through ``datasets`` (``json``, ``parquet`` and ``text`` builders, streaming), so local
files and hub data behave the same and memory never depends on a file's size
(:class:`posbench.data.documents.DocumentReader`). Nothing here touches the network unless a hub name is
asked for and the hub is not marked offline.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.data import corpus, hub
from posbench.data.documents import DocumentReader
from posbench.data.hub_env import WHAT_TO_PASS, hub_offline
from posbench.data.errors import DataError
from posbench.data.hub_errors import explain

COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text", ".text": "text",
            ".md": "text"}
HELD_OUT_NAMES = ("validation", "valid", "val", "dev", "test", "heldout", "held_out")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")

def file_kind(path: Path) -> str | None:
    """The ``datasets`` builder for a file name (``json``, ``parquet``, ``text``) or None."""
    name = path.name.lower()
    for comp in COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    return BUILDERS.get(Path(name).suffix)


def looks_like_hub_name(spec: str) -> bool:
    if spec.strip().lower() in hub.KNOWN:
        return True
    if file_kind(Path(spec.split(":")[0])) is not None:   # data/train.jsonl is a path, not owner/name
        return False
    return bool(_HUB_NAME.match(spec)) and not spec.startswith((".", "/", "~"))


def _is_held_out_file(path: Path, root: Path) -> bool:
    parts = [p.lower() for p in path.relative_to(root).parts[:-1]]
    stem = path.name.lower().split(".")[0]
    words = re.split(r"[-_]", stem)
    return any(p in HELD_OUT_NAMES for p in parts) or stem in HELD_OUT_NAMES or any(w in HELD_OUT_NAMES for w in words)


@dataclass
class TextSource:
    """A named source of documents. Use :func:`open_source` to build one."""

    spec: str
    kind: str                                   # builtin | local | hub
    text_field: str = "text"
    holdout_every: int = 20
    files: list[Path] = field(default_factory=list)
    root: Path | None = None
    hub_name: str | None = None
    hub_config: str | None = None
    hub: Any = None                             # posbench.data.hub.HubSpec for hub sources
    _plan: dict[str, str] | None = field(default=None, repr=False)
    _split_files: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict, repr=False)

    # ----------------------------------------------------------------------------------------------
    def documents(self, split: str = "train") -> Iterator[str]:
        """Documents of ``split`` (``train`` or ``validation``), in a fixed order."""
        return iter(self.reader(split))

    def reader(self, split: str = "train", state: dict[str, Any] | None = None):
        """A resumable :class:`~posbench.data.documents.DocumentReader` over ``split``."""
        return DocumentReader(self, split, state)

    def describe(self) -> dict[str, Any]:
        """What the result records about the source (the content hash is added by whoever reads it)."""
        if self.kind == "builtin":
            return corpus.describe()
        if self.kind == "local":
            return {"name": self.spec, "kind": "local", "root": str(self.root), "text_field": self.text_field,
                    "files": [str(p.relative_to(self.root)) if self.root.is_dir() else p.name for p in self.files],
                    "holdout": self._holdout_rule()}
        out = {"name": self.spec, "kind": "hub", "hub_name": self.hub_name, "hub_config": self.hub_config,
               "text_field": self.text_field}
        if self.hub is not None:
            out.update(self.hub.describe())
        if self._plan is not None:
            out["holdout"] = self._plan["rule"]
        return out

    def identity(self, split: str = "train") -> dict[str, Any]:
        """What names the content of ``split`` exactly enough to key a token cache (local files: paths, sizes
        and modification times; hub data files: names inside the repository and sizes; a hub repository read
        by name: the name)."""
        base = {"kind": self.kind, "text_field": self.text_field, "holdout_every": self.holdout_every}
        if self.kind == "builtin":
            return {**base, **corpus.describe()}
        if self.kind == "local":
            return {**base, "files": [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in self.files]}
        out = {**base, "hub": self.hub.describe(), "plan": self.split_plan()["validation"]}
        if self.hub.builder:
            prefix = hub.HUB_ROOT.rstrip("/") + "/"
            plan = self.split_plan()["validation"]
            files = self.split_files("train" if plan == "held-out slice" else split)
            out["files"] = [[url[len(prefix):] if url.startswith(prefix) else url, size] for url, _, size in files]
        return out

    # ---- splits ----------------------------------------------------------------------------------------------
    def split_plan(self) -> dict[str, str]:
        """Where the held-out split comes from: ``{"validation": "split" | "files" | "held-out slice" | "builtin",
        "rule": a sentence}``. Hub names ask the hub (once) unless posbench knows their files."""
        if self._plan is None:
            self._plan = self._make_plan()
        return self._plan

    def _make_plan(self) -> dict[str, str]:
        if self.kind == "builtin":
            return {"validation": "builtin", "rule": "files whose path digest starts below 16 (1 in 16)"}
        if self.kind == "local":
            named = self._holdout_rule().startswith("by file name")
            return {"validation": "files" if named else "held-out slice", "rule": self._holdout_rule()}
        self.check_online()

        try:
            splits = hub.split_names(self.hub)
        except DataError:
            raise
        except Exception as exc:   # noqa: BLE001
            raise self.hub_error(exc) from None
        if "train" not in splits:
            raise DataError(f"hub data set '{self.hub.name}' has no train split (splits: {', '.join(splits)}); "
                            f"{WHAT_TO_PASS}")
        if "validation" in splits:
            return {"validation": "split", "rule": "the data set's validation split"}
        return {"validation": "held-out slice",
                "rule": f"no validation split: training documents whose index is 0 mod {self.holdout_every} "
                        f"are held out"}

    def split_files(self, split: str) -> list[tuple[str, str, int]]:
        """``(path or URL, builder, size)`` of the files of ``split``, in reading order (local sources and hub
        data sets read by files)."""
        if split not in self._split_files:
            self._split_files[split] = self._list_split_files(split)
        return self._split_files[split]

    def _list_split_files(self, split: str) -> list[tuple[str, str, int]]:
        if self.kind == "local":
            split_root = self._split_root()
            named = [p for p in self.files if _is_held_out_file(p, split_root)]
            if named:
                chosen = named if split == "validation" else [p for p in self.files if p not in named]
            else:
                chosen = list(self.files)
            return [(str(p), file_kind(p), p.stat().st_size) for p in chosen]
        self.check_online()

        found: list[tuple[str, str, int]] = []
        try:
            for pattern in self.hub.patterns(split):
                found.extend((url, self.hub.builder, size) for url, size in hub.list_files(pattern))
        except Exception as exc:   # noqa: BLE001
            raise self.hub_error(exc) from None
        if not found:
            raise DataError(f"hub data set '{self.hub.name}': no files match {', '.join(self.hub.patterns(split))}; "
                            f"{WHAT_TO_PASS}")
        return found

    def label(self, url: str) -> str:
        """How a file is named in messages."""
        if self.kind == "local" and self.root is not None and self.root.is_dir():
            try:
                return str(Path(url).relative_to(self.root))
            except ValueError:
                return url
        return url

    # ---- the hub ---------------------------------------------------------------------------------------------
    def check_online(self) -> None:
        local_root = self.hub is not None and self.hub.builder and not hub.HUB_ROOT.startswith("hf://")
        if self.kind == "hub" and hub_offline() and not local_root:
            raise DataError(f"cannot load hub data set '{self.hub_name}' offline: {WHAT_TO_PASS}")

    def hub_error(self, exc: BaseException) -> DataError:
        name = self.hub.name if self.hub is not None else str(self.hub_name)
        message = explain(exc, name, offline=WHAT_TO_PASS)
        if message:
            return DataError(message)
        first = str(exc).splitlines()[0] if str(exc) else ""
        return DataError(f"cannot load hub data set '{name}' ({type(exc).__name__}: {first}): {WHAT_TO_PASS}")

    # ----------------------------------------------------------------------------------------------
    def _holdout_rule(self) -> str:
        if any(_is_held_out_file(p, self._split_root()) for p in self.files):
            return "by file name (validation/valid/val/dev/test)"
        return f"documents whose index is 0 mod {self.holdout_every}"

    def _split_root(self) -> Path:
        return self.root if self.root.is_dir() else self.root.parent


def _local_files(path: Path) -> list[Path]:
    if path.is_file():
        if file_kind(path) is None:
            raise DataError(f"{path}: unsupported file type; use .jsonl, .json, .parquet or .txt "
                            f"(optionally .gz/.bz2/.xz/.zst)")
        return [path]
    files = sorted((p for p in path.rglob("*") if p.is_file() and file_kind(p) is not None),
                   key=lambda p: p.relative_to(path).as_posix())
    if not files:
        raise DataError(f"{path} holds no .jsonl, .json, .parquet or .txt files")
    return files


def open_source(spec: str | None, text_field: str = "text", holdout_every: int = 20) -> TextSource:
    """Resolve ``--data SOURCE``: ``stdlib`` (default), a local file or directory, or a hub name."""
    spec = (spec or corpus.NAME).strip()
    if spec.lower() in (corpus.NAME, "builtin", "default"):
        return TextSource(spec=corpus.NAME, kind="builtin", text_field="text")
    path = Path(os.path.expanduser(spec))
    if path.exists():
        root = path.resolve() if path.is_dir() else path       # files and root alike (a relative --data DIR)
        return TextSource(spec=spec, kind="local", text_field=text_field, holdout_every=holdout_every,
                          files=_local_files(root), root=root)
    if spec.lower().rstrip("/") in ("scrolls", "tau/scrolls", "hf://datasets/tau/scrolls"):
        raise DataError(f"{spec} is the SCROLLS benchmark, which the scrolls task reads (posbench run -t scrolls), "
                        f"not a text corpus; {WHAT_TO_PASS}")
    if looks_like_hub_name(spec):
        resolved = hub.resolve(spec)
        return TextSource(spec=spec, kind="hub", text_field=text_field, holdout_every=holdout_every,
                          hub_name=resolved.repo if resolved.builder is None else resolved.name.split(":")[0],
                          hub_config=resolved.config, hub=resolved)
    raise DataError(f"no such file or directory: {spec}; {WHAT_TO_PASS}")
