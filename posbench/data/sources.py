"""Text sources named by ``--data SOURCE``: the built-in corpus, a hub name, or local files.

Every source yields documents (strings) for a split (``train`` or ``validation``) in the same schema: one
document per row in a text field (``text`` unless told otherwise). Kinds:

* ``stdlib`` (the default): the built-in corpus of ``posbench.data.corpus``; no download.
* a local path: a ``.jsonl``/``.json``/``.parquet`` file (one row per document), a ``.txt``/``.md`` file
  (one document per file), each optionally compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``), or a directory
  of them (searched recursively, sorted by path). Files whose name up to the first ``.``, ``-`` or ``_`` is
  ``validation``, ``valid``, ``val``, ``dev`` or ``test`` (or that sit under a directory of that name) form
  the held-out split; when there are none, every ``holdout_every``-th document is held out (indices 0,
  k, 2k, ...).
* a hub name (``owner/name``, optionally ``owner/name:config``, or an alias such as ``c4``, ``pg19``,
  ``proof-pile``) loaded with ``datasets`` in streaming mode when a network is there. Offline the source
  raises a one-line :class:`DataError` that says what to pass instead.

Loading goes through ``datasets`` (``json``, ``parquet`` and ``text`` builders) so local files and hub
data behave the same. Nothing here touches the network unless a hub name is asked for and the hub is not
marked offline.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.data import corpus
from posbench.data.errors import DataError

HUB_ALIASES: dict[str, tuple[str, str | None]] = {
    "c4": ("allenai/c4", "en"),
    "pg19": ("deepmind/pg19", None),
    "proof-pile": ("hoskinson-center/proof-pile", None),
    "proofpile": ("hoskinson-center/proof-pile", None),
    "scrolls": ("tau/scrolls", None),
}
HUB_DEFAULT_CONFIG = {"allenai/c4": "en"}
# the held-out split each hub data set calls "validation" (C4 has one; PG19 and proof-pile too)
HUB_SPLITS = {"train": "train", "validation": "validation"}

COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text", ".text": "text",
            ".md": "text"}
HELD_OUT_NAMES = ("validation", "valid", "val", "dev", "test", "heldout", "held_out")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")

WHAT_TO_PASS = ("pass a local copy with --data PATH (a .jsonl/.json/.parquet/.txt file or a directory of "
                "them, one document per row in a 'text' field) or use the built-in corpus with --data stdlib")


def hub_offline() -> bool:
    """True when the environment marks the Hugging Face hub offline (checked before any network call)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    try:
        from huggingface_hub import constants
        return bool(constants.HF_HUB_OFFLINE)
    except Exception:       # noqa: BLE001 - an old or missing huggingface_hub just means "not flagged"
        return False


def file_kind(path: Path) -> str | None:
    """The ``datasets`` builder for a file name (``json``, ``parquet``, ``text``) or None."""
    name = path.name.lower()
    for comp in COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    return BUILDERS.get(Path(name).suffix)


def looks_like_hub_name(spec: str) -> bool:
    if spec.lower() in HUB_ALIASES:
        return True
    if file_kind(Path(spec.split(":")[0])) is not None:   # data/train.jsonl is a path, not owner/name
        return False
    return bool(_HUB_NAME.match(spec)) and not spec.startswith((".", "/", "~"))


def _is_held_out_file(path: Path, root: Path) -> bool:
    parts = [p.lower() for p in path.relative_to(root).parts[:-1]]
    stem = path.name.lower().split(".")[0]
    words = re.split(r"[-_]", stem)
    return any(p in HELD_OUT_NAMES for p in parts) or stem in HELD_OUT_NAMES or words[0] in HELD_OUT_NAMES


def _held_out_index(index: int, every: int) -> bool:
    return index % every == 0


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

    # ----------------------------------------------------------------------------------------------
    def documents(self, split: str = "train") -> Iterator[str]:
        """Documents of ``split`` (``train`` or ``validation``), in a fixed order."""
        if split not in ("train", "validation"):
            raise DataError(f"unknown split '{split}': use train or validation")
        if self.kind == "builtin":
            yield from corpus.stdlib_documents(split)
        elif self.kind == "local":
            yield from self._local_documents(split)
        else:
            yield from self._hub_documents(split)

    def describe(self) -> dict[str, Any]:
        """What the result records about the source (the content hash is added by whoever reads it)."""
        if self.kind == "builtin":
            return corpus.describe()
        if self.kind == "local":
            return {"name": self.spec, "kind": "local", "root": str(self.root), "text_field": self.text_field,
                    "files": [str(p.relative_to(self.root)) if self.root.is_dir() else p.name for p in self.files],
                    "holdout": self._holdout_rule()}
        return {"name": self.spec, "kind": "hub", "hub_name": self.hub_name, "hub_config": self.hub_config,
                "text_field": self.text_field}

    # ----------------------------------------------------------------------------------------------
    def _holdout_rule(self) -> str:
        if any(_is_held_out_file(p, self._split_root()) for p in self.files):
            return "by file name (validation/valid/val/dev/test)"
        return f"documents whose index is 0 mod {self.holdout_every}"

    def _split_root(self) -> Path:
        return self.root if self.root.is_dir() else self.root.parent

    def _local_documents(self, split: str) -> Iterator[str]:
        split_root = self._split_root()
        named = [p for p in self.files if _is_held_out_file(p, split_root)]
        if named:
            chosen = named if split == "validation" else [p for p in self.files if p not in named]
            for path in chosen:
                yield from self._read_file(path)
            return
        index = 0
        for path in self.files:
            for text in self._read_file(path):
                if _held_out_index(index, self.holdout_every) == (split == "validation"):
                    yield text
                index += 1

    def _read_file(self, path: Path) -> Iterator[str]:
        builder = file_kind(path)
        datasets = _datasets()

        kwargs: dict[str, Any] = {}
        if builder == "text":
            kwargs["sample_by"] = "document"
        try:
            ds = datasets.load_dataset(builder, data_files=[str(path)], split="train", **kwargs)
        except Exception as exc:   # noqa: BLE001 - any parse error becomes one line naming the file
            raise DataError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
        field_name = "text" if builder == "text" else self.text_field
        if field_name not in ds.column_names:
            raise DataError(f"{path} has no '{field_name}' field (columns: {', '.join(ds.column_names)}); "
                            f"pass --text-field NAME")
        for value in ds[field_name]:
            if isinstance(value, str) and value:
                yield value

    def _hub_documents(self, split: str) -> Iterator[str]:
        if hub_offline():
            raise DataError(f"cannot load hub data set '{self.hub_name}' offline: {WHAT_TO_PASS}")
        datasets = _datasets()

        try:
            ds = datasets.load_dataset(self.hub_name, self.hub_config, split=HUB_SPLITS[split], streaming=True)
            for row in ds:
                value = row.get(self.text_field)
                if value is None:
                    raise DataError(f"hub data set '{self.hub_name}' has no '{self.text_field}' field "
                                    f"(columns: {', '.join(row)}); pass --text-field NAME")
                if value:
                    yield value
        except DataError:
            raise
        except Exception as exc:   # noqa: BLE001 - network, auth or missing-config errors
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise DataError(f"cannot load hub data set '{self.hub_name}' ({type(exc).__name__}: {first}): "
                            f"{WHAT_TO_PASS}") from None


def _datasets():
    """``datasets``, imported on first use (it is heavy) and kept quiet (no progress bars)."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


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
        files = _local_files(path)
        return TextSource(spec=spec, kind="local", text_field=text_field, holdout_every=holdout_every,
                          files=files, root=path.resolve() if path.is_dir() else path)
    if looks_like_hub_name(spec):
        name, _, config = spec.partition(":")
        if name.lower() in HUB_ALIASES:
            name, alias_config = HUB_ALIASES[name.lower()]
            config = config or alias_config
        config = config or HUB_DEFAULT_CONFIG.get(name)
        return TextSource(spec=spec, kind="hub", text_field=text_field, hub_name=name, hub_config=config or None)
    raise DataError(f"no such file or directory: {spec}; {WHAT_TO_PASS}")


def hash_documents(docs: Iterable[str]) -> tuple[str, int, int]:
    """SHA-256 over the documents (UTF-8, each followed by a NUL byte), their count and total characters."""
    h = hashlib.sha256()
    n = chars = 0
    for text in docs:
        h.update(text.encode("utf-8"))
        h.update(b"\0")
        n += 1
        chars += len(text)
    return h.hexdigest(), n, chars
