"""The token cache's files, each checked against a checksum of its own bytes before anything in it is used.

- ``meta.json``, ``progress.json``, ``complete.json`` carry ``"checksum"``: the SHA-256 of the rest of the
  object written canonically (``json.dumps(..., sort_keys=True, separators=(",", ":"))``). ``read_state``
  refuses a file whose checksum is missing or differs, or that is not JSON.
- ``tokens.bin`` is covered by ``tokens_sha256`` in ``progress.json`` (its first ``tokens`` ids, the last
  commit) and in ``complete.json`` (all of it): the SHA-256 of its bytes, which ``hash_tokens`` recomputes in
  streaming chunks (the size is checked first, so a short file is refused before it is read).

Every refusal is a ``CacheDamaged`` error: one line naming the directory and what is wrong, exit code 1 (the
disk, not the user's input), and what to do (delete the directory, which rebuilds the cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from posbench.data.errors import DataError

CHUNK_BYTES = 16 << 20


class CacheDamaged(DataError):
    """A token cache whose files do not match their checksums (or are short); exit code 1."""

    exit_code = 1


def damaged(directory: Path, what: str) -> CacheDamaged:
    return CacheDamaged(f"token cache {directory} is damaged: {what}; it is not used (delete that directory to "
                        f"rebuild it)")


def _canonical(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def write_state(path: Path, data: dict[str, Any]) -> None:
    """``data`` plus its checksum, written atomically and durably (fsync, then a rename)."""
    body = {k: v for k, v in data.items() if k != "checksum"}
    text = json.dumps({**body, "checksum": hashlib.sha256(_canonical(body)).hexdigest()})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    """The object in ``path`` (without its checksum), None when there is no such file; ``CacheDamaged`` when
    it is unreadable or its checksum does not match."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise damaged(path.parent, f"{path.name} is unreadable ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("checksum"), str):
        raise damaged(path.parent, f"{path.name} has no checksum")
    body = {k: v for k, v in data.items() if k != "checksum"}
    if hashlib.sha256(_canonical(body)).hexdigest() != data["checksum"]:
        raise damaged(path.parent, f"{path.name} does not match its checksum")
    return body


def hash_tokens(path: Path, n_bytes: int, expected: str | None = None):
    """A SHA-256 object fed with the first ``n_bytes`` bytes of ``path`` (read in chunks of 16 MiB); when
    ``expected`` is given, ``CacheDamaged`` unless the digest is that. A file shorter than ``n_bytes`` is
    refused before it is read (it is never padded)."""
    size = path.stat().st_size if path.exists() else 0
    if size < n_bytes:
        raise damaged(path.parent, f"{path.name} holds {size} bytes, fewer than the {n_bytes} its last commit "
                                   f"recorded")
    digest = hashlib.sha256()
    left = n_bytes
    with open(path, "rb") as f:
        while left > 0:
            block = f.read(min(CHUNK_BYTES, left))
            if not block:
                raise damaged(path.parent, f"{path.name} ended before {n_bytes} bytes")
            digest.update(block)
            left -= len(block)
    if expected is not None and digest.hexdigest() != expected:
        raise damaged(path.parent, f"{path.name} does not match its checksum (tokens_sha256)")
    return digest
