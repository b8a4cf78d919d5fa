"""Training windows read from a growing token cache, in an order that never waits for the whole budget.

``ChunkStream`` (``posbench.tasks.corpus_task``) visits the non-overlapping windows of an in-memory token array
in one random permutation per epoch: example 0 may be the last window, so all tokens must exist before step 1.
For budgets tokenised into a :class:`~posbench.data.token_cache.TokenCache` the order is *block-local*
instead: window ``w`` lies in block ``w // B`` (``B = block_tokens // length`` windows; 4M tokens, i.e. 4096
windows of 1024 tokens, eight steps of the paper's 512-sequence batch), and the windows of block ``b`` of epoch
``e`` are visited in the permutation ``default_rng([seed, 11, e, b]).permutation(size of b)``. Example ``g``
of the first epoch needs only the tokens up to the end of its own block, so training starts as soon as the
first block is tokenised and keeps a few blocks behind the producer.

Example ``g`` is a pure function of ``(seed, g)`` and of the cache's final content, however fast the producer
runs: a block is used only once it is complete (or the corpus has ended, which fixes the size of the last
block), and the epoch arithmetic uses the final window count, which is known by the time a second epoch is
reached. ``--resume`` and ``torchrun`` ranks (``IndexedStream.skip``) therefore see exactly the examples of an
uninterrupted single process.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from posbench.data.errors import DataError

BLOCK_TOKENS = 1 << 22


class BlockOrder:
    """Example index -> window index, block-local permutations (see the module docstring)."""

    def __init__(self, length: int, block_tokens: int | None = None):
        self.length = int(length)
        self.block = max(1, int(block_tokens or BLOCK_TOKENS) // self.length)
        self._perms: OrderedDict[tuple[int, int, int, int], np.ndarray] = OrderedDict()

    def needed_tokens(self, g: int) -> int:
        """Tokens that must exist before example ``g`` of the first epoch can be read: its whole block."""
        return (g // self.block + 1) * self.block * self.length + 1

    def window(self, seed: int, g: int, n_windows: int | None = None) -> int:
        """The window of example ``g``. ``n_windows`` None: the corpus is still growing and ``g``'s block of the
        first epoch is complete; otherwise the final number of windows."""
        if n_windows is None:
            epoch, pos, size = 0, g, self.block
        else:
            epoch, pos = divmod(g, n_windows)
            size = min(self.block, n_windows - (pos // self.block) * self.block)
        b, r = divmod(pos, self.block)
        return b * self.block + int(self._perm(seed, epoch, b, size)[r])

    def _perm(self, seed: int, epoch: int, block: int, size: int) -> np.ndarray:
        key = (seed, epoch, block, size)
        perm = self._perms.get(key)
        if perm is None:
            perm = np.random.default_rng([seed, 11, epoch, block]).permutation(size)
            self._perms[key] = perm
            if len(self._perms) > 8:
                self._perms.popitem(last=False)
        return perm


class CachedChunks:
    """Windows of ``length + 1`` tokens (inputs and next-token targets) from a token cache, block-local order."""

    def __init__(self, cache, length: int, block_tokens: int | None = None):
        self.cache, self.length = cache, int(length)
        self.order = BlockOrder(length, block_tokens)

    def wait_until_ready(self) -> None:
        """Block until the first example can be read (the first block is tokenised), then hand the terminal to
        the training bar."""
        self.window(0, 0)
        self.cache.detach_progress()

    def n_windows(self) -> int | None:
        if not self.cache.finished:
            return None
        n = (self.cache.total - 1) // self.length
        if n < 1:
            raise DataError(f"the training text has {self.cache.total} tokens, fewer than one sequence of "
                            f"{self.length + 1}")
        return n

    def window(self, seed: int, g: int) -> int:
        if not self.cache.finished:
            self.cache.wait_for(self.order.needed_tokens(g))
        return self.order.window(seed, g, self.n_windows())

    def rows(self, seed: int, start: int, count: int) -> np.ndarray:
        """Examples ``start .. start + count - 1`` as an int64 array ``[count, length + 1]``."""
        out = np.empty((count, self.length + 1), dtype=np.int64)
        for i in range(count):
            w = self.window(seed, start + i)
            out[i] = self.cache.read(w * self.length, self.length + 1)
        return out
