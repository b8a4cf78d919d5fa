"""Language-model token streams: documents tokenized, joined with EOS, and cut into fixed-length chunks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from posbench.data.sources import TextSource
from posbench.data.tokenizer import Tokenizer


@dataclass
class TokenStream:
    tokens: np.ndarray          # int64 [n]
    documents: int              # documents used (the last one may be cut by max_tokens)
    characters: int
    sha256: str                 # SHA-256 of those documents' texts (UTF-8, each followed by NUL)
    truncated: bool             # True when max_tokens was reached (the split may hold more)

    def describe(self) -> dict[str, Any]:
        return {"tokens": int(len(self.tokens)), "documents": self.documents, "characters": self.characters,
                "sha256": self.sha256, "truncated": self.truncated, "separator": "eos"}


def token_stream(source: TextSource, split: str, tokenizer: Tokenizer, max_tokens: int | None = None,
                 batch_docs: int = 16) -> TokenStream:
    """Tokenize ``split`` of ``source`` in order, each document followed by EOS, up to ``max_tokens``.

    The hash, document and character counts cover exactly the documents whose tokens were used (the last
    one possibly cut)."""
    h = hashlib.sha256()
    parts: list[np.ndarray] = []
    total = docs = chars = 0
    pending: list[str] = []
    batch = 1 if tokenizer.kind == "byte" else batch_docs

    def flush() -> bool:
        nonlocal total, docs, chars
        if tokenizer.kind == "byte":       # fast path: the UTF-8 bytes are the ids
            encoded = [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in pending]
        else:
            encoded = tokenizer.encode_batch(pending)
        for text, ids in zip(pending, encoded):
            arr = np.empty(len(ids) + 1, dtype=np.int64)
            arr[:-1] = ids
            arr[-1] = tokenizer.eos_id
            parts.append(arr)
            total += len(arr)
            h.update(text.encode("utf-8"))
            h.update(b"\0")
            docs += 1
            chars += len(text)
            if max_tokens is not None and total >= max_tokens:
                return True
        pending.clear()
        return False

    stop = False
    for text in source.documents(split):
        pending.append(text)
        if len(pending) >= batch and flush():
            stop = True
            break
    if not stop and pending:
        stop = flush()
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    truncated = stop
    if max_tokens is not None and len(tokens) > max_tokens:
        tokens = tokens[:max_tokens]
    return TokenStream(tokens, docs, chars, h.hexdigest(), truncated)


def chunk(tokens: np.ndarray | torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping ``[n, length]`` chunks; the remainder (fewer than ``length`` tokens) is dropped."""
    t = torch.as_tensor(tokens, dtype=torch.long)
    n = len(t) // length
    return t[: n * length].view(n, length)
