"""The character tokenizer of McLeish et al.'s arithmetic data.

Ids: ``[PAD]=0, [UNK]=1, [BOS]=2, [EOS]=3``, then the characters ``0123456789+-x=`` from 4 (digits 4-13,
``+`` 14, ``-`` 15, ``x`` 16, ``=`` 17); a space maps to ``[PAD]``. Decoding drops PAD, BOS and EOS.
"""

from __future__ import annotations

from collections.abc import Iterable

PAD, UNK, BOS, EOS = 0, 1, 2, 3
SPECIALS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
CHARS = "0123456789+-x="


class CharTokenizer:
    def __init__(self, chars: str = CHARS):
        self.chars = chars
        self.to_id = {c: i + len(SPECIALS) for i, c in enumerate(chars)}
        self.to_id[" "] = PAD
        self.vocab_size = len(SPECIALS) + len(chars)
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = PAD, UNK, BOS, EOS

    def encode(self, text: str, eos: bool = False) -> list[int]:
        ids = [self.to_id.get(c, UNK) for c in text]
        return ids + [EOS] if eos else ids

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i in (PAD, BOS, EOS):
                continue
            out.append("?" if i == UNK or i >= self.vocab_size else self.chars[i - len(SPECIALS)])
        return "".join(out)

    def id_of(self, char: str) -> int:
        return self.to_id[char]
