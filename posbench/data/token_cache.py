"""An on-disk token cache: a corpus split tokenised once into a file of uint16/uint32 ids, read while it grows.

At the paper's scale (5.2B training tokens) the tokens cannot live in memory, tokenising them takes longer
than anyone wants to wait before step 1, and every encoding of a comparison reads the very same tokens. So a
split is tokenised into ``<cache>/<source>/<split>-<budget>-<key>/tokens.bin`` by a *producer* (a background
thread of the process that holds the directory's lock) while *consumers* (the training stream, other ranks)
wait only for the tokens they need.

Layout of a cache directory::

    meta.json       what the cache holds: source identity, split, tokenizer identity, budget, dtype (the key)
    tokens.bin      the ids, documents in order, each followed by EOS; little-endian uint16 when the
                    vocabulary fits, else uint32
    progress.json   the last commit (after every batch of documents): tokens, documents, characters, hash
                    chain, the SHA-256 of tokens.bin so far and the document reader's position -- written
                    atomically after tokens.bin is flushed to disk
    complete.json   the final commit, instead of a last progress.json (one atomic step: there is no moment at
                    which the cache is finished but not marked so): the final counts and hashes
    lock            flock'ed by the producer

Every file carries a checksum of its own bytes (``posbench.data.cache_files``): the JSON files a checksum of
their content, ``tokens.bin`` its SHA-256 (``tokens_sha256``) in the commit that covers it. They are checked
before the cache is read: a complete cache when a process first finds it complete (its whole ``tokens.bin``
is hashed, in 16 MiB chunks), an unfinished one when a producer continues it (the committed part). A
mismatch or a file shorter than its commit stops the run with one line (``CacheDamaged``) and the cache is
never read; a truncated ``tokens.bin`` is never padded.

The key is the SHA-256 of (format version, source identity, split, tokenizer identity, budget): the next run
with the same corpus, tokenizer and budget (the next encoding of a comparison) reuses the cache, and a
killed run resumes tokenising from its last commit (bytes past it are cut off). The root is
``$POSBENCH_CACHE`` (default ``$XDG_CACHE_HOME/posbench`` or ``~/.cache/posbench``) plus ``tokens/``; delete a
directory to rebuild it.

The documents' hash is a chain over the documents used, ``h_0 = 0^32``, ``h_i = SHA-256(h_{i-1} ||
SHA-256(utf8(doc_i)))`` (hex of the last), which a resumed producer continues exactly; ``tokens_sha256`` is the
hash of the tokens themselves (the record's ``data.hash``), equal to ``TokenStream.tokens_sha256`` of the same
tokens read in memory.

Tokenising runs in parallel (:mod:`posbench.data.producer`): one thread reads documents (``datasets``
decompresses and parses in C) while the producer encodes batches of documents with the tokenizer's batch
encoder (``tokenizers`` releases the GIL and encodes the batch on every core). Progress (tokens, throughput,
ETA) is shown by a :class:`posbench.data.progress.DataBar`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from posbench.data.cache_files import damaged, hash_tokens, read_state, write_state
from posbench.data.errors import DataError
from posbench.data.producer import produce
from posbench.data.progress import DataBar
from posbench.errors import EnvironmentFault, UserError, os_error

FORMAT = 2
POLL_SECONDS = 0.25            # how often a consumer in another process looks at progress.json
STALL_SECONDS = 600.0          # a producer in another process that commits nothing for this long is stuck
_OPEN: dict[str, TokenCache] = {}
_OPEN_LOCK = threading.Lock()


def cache_root() -> Path:
    base = os.environ.get("POSBENCH_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg, "posbench") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "posbench")
    return Path(base) / "tokens"


def stall_seconds() -> float:
    """How long a consumer waits for a producer in another process that commits nothing (0: forever)."""
    text = os.environ.get("POSBENCH_CACHE_STALL", "")
    try:
        value = float(text) if text else STALL_SECONDS
    except ValueError:
        raise UserError(f"POSBENCH_CACHE_STALL={text!r} is not a number of seconds") from None
    if not value >= 0:
        raise UserError(f"POSBENCH_CACHE_STALL={text!r} must be 0 (wait forever) or a positive number of seconds")
    return value


def tokenizer_identity(tokenizer) -> dict[str, Any]:
    """The tokenizer's recorded spec plus, for a Hugging Face tokenizer, the SHA-256 of its definition."""
    spec = dict(tokenizer.spec())
    hf = getattr(tokenizer, "hf", None)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is not None:
        spec["sha256"] = hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()
    return spec


def _slug(text: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in text.strip("/"))[-60:]
    return keep if keep.strip(".") else "source"            # never "." or "..": a directory of the root


def token_dtype(vocab_size: int) -> np.dtype:
    """How a cache stores ids (and ``tokens_sha256`` hashes them): little-endian uint16, or uint32."""
    return np.dtype("<u2" if vocab_size <= (1 << 16) else "<u4")


def open_cache(source, split: str, tokenizer, budget: int | None, *, root: Path | None = None,
               progress: bool | None = None) -> TokenCache:
    """The token cache of ``split`` of ``source`` under ``tokenizer`` with at most ``budget`` tokens (None: the
    whole split), producing it in the background when it is not complete. One object per directory and
    process."""
    tok_id = tokenizer_identity(tokenizer)
    identity = {"format": FORMAT, "source": source.identity(split), "split": split, "tokenizer": tok_id,
                "budget": budget}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = source.hub.name if getattr(source, "hub", None) is not None else source.spec
    directory = (root or cache_root()) / _slug(name) / f"{split}-{budget if budget else 'all'}-{key}"
    with _OPEN_LOCK:
        cache = _OPEN.get(str(directory))
        if cache is None:
            cache = TokenCache(directory, identity, vocab_size=tokenizer.vocab_size,
                               label=f"tokenize {source.spec} {split}", progress=progress)
            _OPEN[str(directory)] = cache
    cache.start(source, tokenizer)
    return cache


class TokenCache:
    """One cache directory: the producer's state (in this process) and the consumer's view (any process)."""

    def __init__(self, directory: Path, identity: dict[str, Any], *, vocab_size: int, label: str,
                 progress: bool | None = None):
        self.directory = Path(directory)
        self.identity = identity
        self.budget: int | None = identity["budget"]
        self.dtype = token_dtype(vocab_size)
        self.label = label
        self._progress = progress
        self._cond = threading.Condition()
        self._committed = 0
        self._final: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock_fd: int | None = None
        self.bar = None                                 # the producer's DataBar
        self._mm: np.memmap | None = None
        self._mapped = 0
        self._last_commit: dict[str, Any] | None = None     # this process's producer's last commit
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = read_state(self.path("meta.json"))
        if meta is None:
            write_state(self.path("meta.json"), {**identity, "dtype": self.dtype.name, "created": time.time()})
        elif meta.get("dtype") != self.dtype.name:
            raise DataError(f"token cache {self.directory} holds {meta.get('dtype')} ids, expected "
                            f"{self.dtype.name}; delete it")
        self._refresh()

    def path(self, name: str) -> Path:
        return self.directory / name

    # ---- the consumer's view -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Read another process's progress from disk (this process's producer updates memory directly); a
        complete cache is verified against its checksums before this process reads it."""
        if self._final is None:
            final = read_state(self.path("complete.json"))
            if final is not None:
                self._verify(final)
                self._final = final
                self._committed = int(final["tokens"])
                return
        if self._final is None and self._thread is None:
            progress = read_state(self.path("progress.json"))
            if progress is not None:
                self._committed = max(self._committed, int(progress["tokens"]))

    def _verify(self, final: dict[str, Any]) -> None:
        """``tokens.bin`` has exactly the final number of tokens and their SHA-256 (else ``CacheDamaged``)."""
        path, expected = self.path("tokens.bin"), int(final["tokens"]) * self.dtype.itemsize
        size = path.stat().st_size if path.exists() else 0
        if size != expected:
            raise damaged(self.directory, f"tokens.bin holds {size} bytes, its completion recorded {expected}")
        hash_tokens(path, expected, final.get("tokens_sha256") or "missing")

    @property
    def finished(self) -> bool:
        return self._final is not None

    @property
    def committed(self) -> int:
        return self._committed

    @property
    def total(self) -> int | None:
        """The number of tokens once the cache is complete."""
        return int(self._final["tokens"]) if self._final is not None else None

    def wait_for(self, n_tokens: int) -> int:
        """Block until ``n_tokens`` tokens are committed or the cache is complete; the tokens available.

        A producer in another process that holds the lock but commits nothing for ``stall_seconds()`` (stopped,
        or hung) is an error, not a wait forever; a producer that died is taken over."""
        seen, since, limit = -1, time.monotonic(), stall_seconds()
        while True:
            with self._cond:
                if self._error is not None:
                    raise self._error
                if self._committed >= n_tokens or self._final is not None:
                    return self._committed
                if self._thread is not None:
                    self._cond.wait(timeout=1.0)
                    continue
            self._refresh()
            if self._committed >= n_tokens or self._final is not None:
                return self._committed
            self._take_over_if_abandoned()
            if self._committed != seen:
                seen, since = self._committed, time.monotonic()
            elif self._thread is None and limit and time.monotonic() - since > limit:
                raise EnvironmentFault(
                    f"token cache {self.directory} has not grown for {limit:g} s: the process filling it (it holds "
                    f"{self.path('lock')}) seems stuck; stop that process (a new run takes over), or set "
                    f"POSBENCH_CACHE_STALL=SECONDS to wait longer (0: wait forever)")
            time.sleep(POLL_SECONDS)

    def wait_complete(self) -> int:
        self.wait_for(1 << 62)
        return int(self.total)

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens ``[start, start + count)`` as int64 (they must be committed)."""
        end = start + count
        if end > self._mapped:
            available = self.wait_for(end)
            if end > available:
                raise DataError(f"token cache {self.directory}: tokens {start}..{end} asked for, only {available} "
                                f"there")
            size = os.stat(self.path("tokens.bin")).st_size
            if size < available * self.dtype.itemsize:
                raise damaged(self.directory, f"tokens.bin holds {size} bytes, its last commit recorded "
                                              f"{available * self.dtype.itemsize}")
            self._mm = np.memmap(self.path("tokens.bin"), dtype=self.dtype, mode="r", shape=(available,))
            self._mapped = available
        return np.asarray(self._mm[start:end], dtype=np.int64)

    @property
    def tokens(self) -> np.ndarray:
        """Every token as an int64 array (waits for the cache to be complete; meant for evaluation budgets)."""
        total = self.wait_complete()
        return self.read(0, total) if total else np.zeros(0, dtype=np.int64)

    def _state(self) -> dict[str, Any]:
        return self._final or self._last_commit or read_state(self.path("progress.json")) or {}

    @property
    def sha256(self) -> str | None:
        return self._state().get("sha256")

    @property
    def tokens_sha256(self) -> str | None:
        """The SHA-256 of the tokens (of those committed so far while the cache is not complete)."""
        return self._state().get("tokens_sha256")

    def describe(self) -> dict[str, Any]:
        state = self._state()
        return {"tokens": int(state.get("tokens", 0)), "documents": int(state.get("documents", 0)),
                "characters": int(state.get("characters", 0)), "sha256": state.get("sha256"),
                "tokens_sha256": state.get("tokens_sha256"),
                "truncated": bool(state.get("truncated", False)), "separator": "eos",
                "complete": self._final is not None, "budget": self.budget,
                "hash": "sha256: SHA-256 chain over the documents used, h_i = sha256(h_(i-1) || sha256(utf8(doc_i))); "
                        "tokens_sha256: SHA-256 of the token ids as little-endian uint16 (uint32 above 65,536 ids)",
                "cache": str(self.directory), "dtype": self.dtype.name}

    def detach_progress(self) -> None:
        """Someone else draws on the terminal from now on (training started): plain progress lines only."""
        if self.bar is not None:
            self.bar.detach()

    # ---- the producer --------------------------------------------------------------------------------------
    def start(self, source, tokenizer) -> None:
        """Start producing in a background thread unless the cache is complete or another process produces."""
        self._source, self._tokenizer = source, tokenizer
        self._refresh()
        if self._final is not None or self._thread is not None:
            return
        if not self._acquire_lock():
            return                                      # another process produces; wait_for polls its progress
        self._refresh()
        if self._final is not None:
            self._release_lock()
            return
        self._thread = threading.Thread(target=self._produce_safely, name=f"posbench-{self.label}", daemon=True)
        self._thread.start()

    def _acquire_lock(self) -> bool:
        fd = os.open(self.path("lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _take_over_if_abandoned(self) -> None:
        """A consumer whose producer (another process) died takes over."""
        if self._thread is None and self._final is None and getattr(self, "_source", None) is not None:
            self.start(self._source, self._tokenizer)

    def _produce_safely(self) -> None:
        try:
            self._produce()
        except BaseException as exc:   # noqa: BLE001 - handed to the consumers, who raise it
            error = exc if isinstance(exc, UserError) else \
                os_error(exc, f"write the token cache {self.directory}:") if isinstance(exc, OSError) else \
                DataError(f"tokenising {self.label.split(' ', 1)[1]} failed: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}")
            with self._cond:
                self._error = error
                self._cond.notify_all()
        finally:
            self._release_lock()
            if self.bar is not None:
                self.bar.close()

    def _show_progress(self) -> bool:
        if self._progress is not None:
            return self._progress
        return os.environ.get("RANK", "0") == "0"

    def _produce(self) -> None:
        self.bar = DataBar(self.label, self.budget, "tok", enabled=None if self._show_progress() else False)
        final = produce(self, self._source, self._tokenizer)      # its last commit wrote complete.json
        self.bar.close()                # its last line before any consumer goes on (and maybe exits)
        with self._cond:
            self._final = final
            self._committed = int(final["tokens"])
            self._cond.notify_all()

    def commit(self, f, state: dict[str, Any], *, complete: bool = False) -> None:
        """Make ``state`` (tokens written to ``f`` so far, their hash, the reader's position...) durable and
        visible; ``complete``: the final commit, written as ``complete.json`` (the one step that ends the
        cache)."""
        f.flush()
        os.fsync(f.fileno())
        if complete:
            write_state(self.path("complete.json"), {**state, "completed": time.time()})
        else:
            write_state(self.path("progress.json"), state)
        self._last_commit = state
        with self._cond:
            self._committed = int(state["tokens"])
            self._cond.notify_all()
        if self.bar is not None:
            self.bar.update(self._committed)
