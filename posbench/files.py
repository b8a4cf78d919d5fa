"""Files that are never half-written: atomic writes (a temporary file in the same directory, then a rename),
JSON lines, JSON reading with one-line errors, and content hashes.

A write that the machine refuses (disk full, permission) is one line (``posbench.errors.os_error``) and leaves
no temporary file; reading opens regular files only (a FIFO named ``result.json`` would block a reader
forever) and a file nested too deep for the JSON parser is unreadable, not a crash."""

from __future__ import annotations

import errno
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
    import gzip

    found = plain_or_gzipped(path)
    if found is None:
        return None
    return gzip.decompress(found.read_bytes()) if found != Path(path) else found.read_bytes()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``; a ``.gz`` file is read through gzip (a published study's large predictions)."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


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
              unreadable: str = "cannot read {path}: {reason}", error: type[UserError] = FileError) -> Any:
    """The JSON in ``path``, or ``error`` with one line: ``missing`` when there is no such file, else
    ``unreadable`` (both may name ``{path}``; ``unreadable`` also ``{reason}``, the first line of the cause)."""
    path = Path(path)
    try:
        return json.loads(read_regular(path))
    except FileNotFoundError:
        raise error(missing.replace("{path}", str(path))) from None
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


def read_regular(path: Path) -> str:
    """The text of ``path`` if it is a regular file; a FIFO or a device is refused (``OSError``) without
    waiting: it is opened non-blocking and checked before anything is read (reading one can block forever)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file: {path}")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read().decode("utf-8")
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
