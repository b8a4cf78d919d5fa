"""Language-model token streams: documents tokenized, joined with EOS, and cut into fixed-length chunks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from posbench.data.sources import TextSource
from posbench.data.token_cache import open_cache, token_dtype
from posbench.data.tokenizer import Tokenizer


@dataclass
class TokenStream:
    tokens: np.ndarray          # int64 [n]
    documents: int              # documents used (the last one may be cut by max_tokens)
    characters: int
    sha256: str                 # SHA-256 of those documents' texts (UTF-8, each followed by NUL)
    truncated: bool             # True when max_tokens was reached (the split may hold more)
    tokens_sha256: str = ""     # SHA-256 of the tokens (``tokens_hash``): what the record's data hash is

    def describe(self) -> dict[str, Any]:
        return {"tokens": int(len(self.tokens)), "documents": self.documents, "characters": self.characters,
                "sha256": self.sha256, "tokens_sha256": self.tokens_sha256, "truncated": self.truncated,
                "separator": "eos"}


def tokens_hash(tokens: np.ndarray, vocab_size: int) -> str:
    """The SHA-256 of ``tokens`` as a token cache stores them (little-endian uint16, or uint32 for a vocabulary
    above 65,536 ids), so the same tokens have the same hash in memory and in a cache."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype=token_dtype(vocab_size)).tobytes()).hexdigest()


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
    return TokenStream(tokens, docs, chars, h.hexdigest(), truncated, tokens_hash(tokens, tokenizer.vocab_size))


def chunk(tokens: np.ndarray | torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping ``[n, length]`` chunks; the remainder (fewer than ``length`` tokens) is dropped."""
    t = torch.as_tensor(tokens, dtype=torch.long)
    n = len(t) // length
    return t[: n * length].view(n, length)


# ---- reading only what is used ------------------------------------------------------------------------------

#: budgets up to this many tokens are read into memory (``token_stream``, ``ChunkStream``: today's path, and
#: the only one the built-in corpus ever takes); larger ones go through the on-disk token cache
IN_MEMORY_MAX_TOKENS = 1 << 24


def training_token_budget(max_train_tokens: int, steps: int, batch_size: int, length: int) -> int:
    """The training tokens to read: ``max_train_tokens`` when set, else exactly what training consumes,
    ``steps x batch_size x length + 1`` (each example is a window of ``length + 1`` tokens; consecutive
    windows share no token, so the ``+ 1`` is the last window's final target)."""
    if max_train_tokens:
        return int(max_train_tokens)
    return int(steps) * int(batch_size) * int(length) + 1


def uses_token_cache(source: TextSource, budget: int | None) -> bool:
    """Whether ``corpus_tokens`` reads through the on-disk cache (never for the built-in corpus)."""
    return source.kind != "builtin" and (budget is None or budget > IN_MEMORY_MAX_TOKENS)


def corpus_tokens(source: TextSource, split: str, tokenizer: Tokenizer, budget: int | None):
    """The first ``budget`` tokens of ``split`` (None: all of it): an in-memory :class:`TokenStream` for the
    built-in corpus and small budgets (exactly ``token_stream``), else a
    :class:`~posbench.data.token_cache.TokenCache` that fills in the background. Both have ``describe()``,
    ``sha256`` and ``tokens`` (the cache's waits for completion: use it for evaluation budgets, and
    ``posbench.data.chunks.CachedChunks`` for training)."""
    if not uses_token_cache(source, budget):
        return token_stream(source, split, tokenizer, budget)
    return open_cache(source, split, tokenizer, budget)
