"""Files that are never half-written: atomic writes (a temporary file in the same directory, then a rename),
JSON lines, JSON reading with one-line errors, and content hashes.

A write that the machine refuses (disk full, permission) is one line (``posbench.errors.os_error``) and leaves
no temporary file; reading opens regular files only (a FIFO named ``result.json`` would block a reader
forever) and a file nested too deep for the JSON parser is unreadable, not a crash."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from posbench.errors import UserError, os_error

_UMASK = os.umask(0)
os.umask(_UMASK)


class FileError(UserError):
    """A missing or unreadable file; ``str()`` is one line."""


# ---- how much posbench reads of a run's files -------------------------------------------------------------
#: the most posbench reads of one file a run wrote, where the file comes from a results tree that anyone may
#: have made (compare, ``posbench.results.frame``): far above what a real run writes (a result.json is a few MB
#: with a long loss history; an arithmetic cell's 10,000 predictions are 1.4 MB), far below what exhausts a
#: machine's memory. A gzipped file counts what it inflates to. A file past its bound is read no further.
MAX_RESULT_BYTES = 64 * 2**20                 # a result.json
MAX_PREDICTIONS_BYTES = 256 * 2**20           # a predictions.jsonl, or what a predictions.jsonl.gz inflates to
MAX_PREDICTIONS_ROWS = 1_000_000              # its lines (the paper's arithmetic grid has 160,000; a row is a dict)
READ_CHUNK = 1 << 20


class TooLarge(OSError):
    """A file (or what a gzipped one inflates to) past the bound its reader set; ``str()`` is one line."""

    def __init__(self, limit: int, inflated: bool = False, what: str | None = None):
        amount = what or size_text(limit)
        super().__init__(f"{'inflates to' if inflated else 'is'} more than {amount}, the most posbench reads of it"
                         if what is None else f"holds more than {amount}, the most posbench reads of it")
        self.limit = limit


def size_text(n: int) -> str:
    return f"{n // 2**20} MB" if n >= 2**20 and n % 2**20 == 0 else f"{n:,} bytes"


def read_bounded(fh: Any, limit: int | None, inflated: bool = False) -> bytes:
    """All of ``fh`` (binary), read in chunks; ``TooLarge`` as soon as it holds more than ``limit`` bytes."""
    if limit is None:
        return fh.read()
    parts, total = [], 0
    while block := fh.read(min(READ_CHUNK, limit + 1 - total)):
        parts.append(block)
        total += len(block)
        if total > limit:
            raise TooLarge(limit, inflated)
    return b"".join(parts)


def atomic_save(path: Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename the temp file onto ``path`` (same directory, so atomic)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "it is a directory", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except FileExistsError:                     # a file where a directory of the path should be
        raise os_error(NotADirectoryError(errno.ENOTDIR, "a file is in the way of its directory", str(path)),
                       "write") from None
    except OSError as exc:
        raise os_error(OSError(exc.errno, exc.strerror, str(path)), "write") from None
    os.close(fd)
    try:
        writer(Path(tmp))
        os.chmod(tmp, 0o666 & ~_UMASK)          # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise os_error(OSError(exc.errno, exc.strerror, str(path)), "write") from None
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    return atomic_save(path, write)


#: how an infinity is written: a number too large for any float, so strict JSON that every reader parses as
#: infinity (Python's json, JavaScript, pandas), where ``Infinity`` is not JSON at all
JSON_INFINITY = "1e999"
_INF_MARK = "~posbench:infinity:a5f0c3~"     # a string no record holds


def json_text(obj: Any, indent: int | None = 2) -> str:
    """``obj`` as strict JSON; infinities as ``1e999`` / ``-1e999``, NaN refused (record it as null)."""
    text = json.dumps(_mark_infinities(obj), indent=indent, default=json_default, allow_nan=False)
    return text.replace(f'"-{_INF_MARK}"', f"-{JSON_INFINITY}").replace(f'"{_INF_MARK}"', JSON_INFINITY)


def _mark_infinities(obj: Any) -> Any:
    if isinstance(obj, float) and math.isinf(obj):
        return f"-{_INF_MARK}" if obj < 0 else _INF_MARK
    if isinstance(obj, dict):
        return {k: _mark_infinities(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_mark_infinities(v) for v in obj]
    return obj


def atomic_write_json(path: Path, obj: Any) -> Path:
    return atomic_write_text(path, json_text(obj) + "\n")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` as JSON lines, atomically; returns how many."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, default=json_default) + "\n")
                count += 1
    atomic_save(path, write)
    return count


def file_in_the_way(path: Path) -> Path | None:
    """The nearest existing folder above ``path`` that is a file instead (nothing could be written under it), or
    None."""
    for parent in Path(path).parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def append_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append ``rows`` as JSON lines in one write, flushed to the disk before this returns (a file other processes
    read while it grows, and a kill after it keeps them)."""
    text = "".join(json.dumps(row, default=json_default) + "\n" for row in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def plain_or_gzipped(path: Path) -> Path | None:
    """``path`` when it is a file, else ``path.gz`` when that is (a published study keeps large predictions
    gzipped, studies/publish.py), else None."""
    path = Path(path)
    gzipped = path.with_name(path.name + ".gz")
    return path if path.is_file() else gzipped if gzipped.is_file() else None


def read_unzipped(path: Path) -> bytes | None:
    """The bytes of ``path``, or of ``path.gz`` decompressed (``plain_or_gzipped``); None when neither is."""
    found = plain_or_gzipped(path)
    if found is None:
        return None
    return gzip.decompress(found.read_bytes()) if found != Path(path) else found.read_bytes()


#: a line of a JSON-lines file that is not blank, from its first character that is not a space to its end (found
#: at C speed: blank lines, however many, cost no more than reading them)
_NONBLANK_LINE = re.compile(rb"\S[^\n]*")


def read_jsonl(path: Path, limit: int | None = None, max_rows: int | None = None) -> list[dict[str, Any]]:
    """The JSON lines of ``path``; a ``.gz`` file is read through gzip (a published study's large predictions).
    ``limit``: ``TooLarge`` once the (inflated) text passes that many bytes, read in chunks and no further (neither
    a gzip bomb nor one endless line is ever held whole); ``max_rows``: likewise past that many lines of JSON."""
    gzipped = str(path).endswith(".gz")
    rows: list[Any] = []

    def take(text: bytes) -> None:
        for line in _NONBLANK_LINE.finditer(text):
            if max_rows is not None and len(rows) >= max_rows:
                raise TooLarge(max_rows, gzipped, f"{max_rows:,} lines")
            rows.append(json.loads(line.group().decode("utf-8")))

    total, pending = 0, []                      # pending: what follows the last newline read
    with (gzip.open if gzipped else open)(path, "rb") as fh:
        while block := fh.read(READ_CHUNK if limit is None else min(READ_CHUNK, limit + 1 - total)):
            total += len(block)
            if limit is not None and total > limit:
                raise TooLarge(limit, gzipped)
            cut = block.rfind(b"\n")
            if cut < 0:                         # no line ends in this chunk
                pending.append(block)
                continue
            lines = b"".join([*pending, block[:cut]])
            if lines.strip():
                take(lines)
            pending = [block[cut + 1:]]
    take(b"".join(pending))
    return rows


def json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_json(path: Path | str, *, missing: str = "{path} does not exist",
              unreadable: str = "cannot read {path}: {reason}", error: type[UserError] = FileError,
              limit: int | None = None) -> Any:
    """The JSON in ``path``, or ``error`` with one line: ``missing`` when there is no such file, else
    ``unreadable`` (both may name ``{path}``; ``unreadable`` also ``{reason}``, the first line of the cause);
    ``limit``: a file of more bytes is not read past them (``{path}`` and what ``TooLarge`` says)."""
    path = Path(path)
    try:
        return json.loads(read_regular(path, limit))
    except FileNotFoundError:
        raise error(missing.replace("{path}", str(path))) from None
    except TooLarge as exc:
        raise error(f"{path} {exc}") from None
    except (OSError, ValueError, RecursionError) as exc:   # ValueError: bad JSON, bad UTF-8, huge integers
        reason = "nested too deep" if isinstance(exc, RecursionError) else \
            (str(exc).splitlines() or [type(exc).__name__])[0]
        raise error(unreadable.replace("{path}", str(path)).replace("{reason}", reason)) from None


def json_object(path: Path | str) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is none (missing, unreadable, not an object)."""
    try:
        data = json.loads(read_regular(Path(path)))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def read_regular(path: Path, limit: int | None = None) -> str:
    """The text of ``path`` if it is a regular file; a FIFO or a device is refused (``OSError``) without
    waiting: it is opened non-blocking and checked before anything is read (reading one can block forever).
    ``limit``: ``TooLarge`` (an ``OSError``) for a file of more bytes, read no further than the bound."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file: {path}")
        if limit is not None and os.fstat(fd).st_size > limit:
            raise TooLarge(limit)
        with os.fdopen(os.dup(fd), "rb") as fh:
            return read_bounded(fh, limit).decode("utf-8")
    finally:
        os.close(fd)


#: a name posbench makes a directory or file of (a run's task and label, a phase, a tokenizer file): letters,
#: digits, '_', '.', '+', '-', starting with a letter or digit; so never '..', a separator or an absolute path
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")


def check_name(value: Any, what: str, error: type[UserError] = UserError) -> str:
    """``value`` if it is a safe single path component (``NAME``), else ``error`` with one line naming ``what``
    (where the value was read: a label from a model directory's metadata, a name from a run's record...)."""
    if isinstance(value, str) and NAME.fullmatch(value):
        return value
    raise error(f"{what} is {str(value)[:120]!r}, which posbench does not use as a file or directory name "
                f"(letters, digits, '_', '.', '+', '-'; at most 100, starting with a letter or digit)")


def inside(root: Path, path: Path) -> bool:
    """Whether ``path`` (resolved) lies inside ``root`` (resolved)."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
    except ValueError:
        return False
    return True


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
