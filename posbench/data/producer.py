"""Filling a token cache: documents read by one thread, tokenised in batches by another, appended and committed.

:func:`produce` continues a cache from its last commit (``progress.json``: tokens, documents, characters, hash
chain, the SHA-256 of the tokens and the document reader's position): it checks the committed bytes against
that hash (a file that is shorter or differs is refused, never padded), cuts off bytes written past it, and
appends ``budget`` tokens at most. Its last commit writes ``complete.json`` instead of ``progress.json``. A :class:`_Prefetch` thread reads batches of documents (``datasets`` decompresses and parses in C, outside
the GIL) while this thread encodes them with the tokenizer's batch encoder (``tokenizers`` encodes a batch on
every core, outside the GIL); every batch ends with a commit, so a killed run loses one batch at most.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from typing import Any

import numpy as np

from posbench.data.cache_files import hash_tokens, read_state

BATCH_CHARS = 4 << 20          # characters of text per tokenizer batch
BATCH_DOCS = 4096


def produce(cache, source, tokenizer) -> dict[str, Any]:
    """Tokenise ``cache.identity["split"]`` of ``source`` into ``cache`` from its last commit; the final state."""
    state = read_state(cache.path("progress.json")) or {
        "tokens": 0, "documents": 0, "characters": 0, "sha256": "00" * 32,
        "tokens_sha256": hashlib.sha256().hexdigest(), "reader": None}
    itemsize = cache.dtype.itemsize
    written, docs, chars = int(state["tokens"]), int(state["documents"]), int(state["characters"])
    chain = bytes.fromhex(state["sha256"])
    data_path = cache.path("tokens.bin")
    with open(data_path, "ab"):
        pass
    tokens_hash = hash_tokens(data_path, written * itemsize, state.get("tokens_sha256") or "missing")
    os.truncate(data_path, written * itemsize)    # bytes past the last commit are not trusted (never extends)
    if cache.bar is not None:
        cache.bar.update(written, first=True)
    budget, eos = cache.budget, int(tokenizer.eos_id)
    truncated = False
    batches = _Prefetch(source.reader(cache.identity["split"], state.get("reader")))
    try:
        with open(data_path, "ab") as f:
            for texts, reader_state in batches:
                encoded = _encode(tokenizer, texts)
                lengths = [len(ids) + 1 for ids in encoded]
                take = len(texts)
                if budget is not None and written + sum(lengths) >= budget:     # the budget ends in this batch
                    room, take = budget - written, 0
                    while room > 0:
                        room -= lengths[take]
                        take += 1
                    truncated = True
                buf = np.empty(sum(lengths[:take]), dtype=cache.dtype)
                pos = 0
                for text, ids in zip(texts[:take], encoded[:take]):
                    n = len(ids)
                    buf[pos:pos + n] = ids          # an id too large for the dtype raises OverflowError
                    buf[pos + n] = eos
                    pos += n + 1
                    chain = hashlib.sha256(chain + hashlib.sha256(text.encode("utf-8")).digest()).digest()
                    docs += 1
                    chars += len(text)
                if truncated:
                    buf = buf[: budget - written]      # the last document is cut at the budget
                data = buf.tobytes()
                f.write(data)
                tokens_hash.update(data)
                written += len(buf)
                if truncated:
                    break
                cache.commit(f, {"tokens": written, "documents": docs, "characters": chars, "sha256": chain.hex(),
                                 "tokens_sha256": tokens_hash.hexdigest(), "reader": reader_state})
            final = {"tokens": written, "documents": docs, "characters": chars, "sha256": chain.hex(),
                     "tokens_sha256": tokens_hash.hexdigest(), "truncated": truncated}
            cache.commit(f, final, complete=True)
    finally:
        batches.close()
    return final


def _encode(tokenizer, texts: list[str]) -> list:
    if tokenizer.kind == "byte":                        # the UTF-8 bytes are the ids
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
    return tokenizer.encode_batch(texts)


class _Prefetch:
    """Batches of documents read by a background thread (with the reader's position after each batch), so that
    reading and decompressing overlap with tokenising."""

    _END = object()

    def __init__(self, reader, depth: int = 2):
        self.reader = reader
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="posbench-read", daemon=True)
        self.thread.start()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            texts: list[str] = []
            size = 0
            for text in self.reader:
                texts.append(text)
                size += len(text)
                if size >= BATCH_CHARS or len(texts) >= BATCH_DOCS:
                    if not self._put((texts, self.reader.state())):
                        return
                    texts, size = [], 0
            if texts and not self._put((texts, self.reader.state())):
                return
            self._put(self._END)
        except BaseException as exc:   # noqa: BLE001 - re-raised in the producer
            self._put(exc)

    def __iter__(self):
        while True:
            item = self.queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.stop.set()
