"""posbench's tokenizers as Hugging Face tokenizers: ``AutoTokenizer`` gives the ids posbench's ``encode`` gives.

Each is a ``tokenizers`` pipeline wrapped as a ``PreTrainedTokenizerFast`` (no post-processor: no BOS or EOS
is added, as posbench's ``encode`` adds none), with posbench's BOS, EOS and PAD ids:

* ``byte``: ids 0-255 are the UTF-8 bytes (a byte-level BPE with the 256 bytes as its vocabulary and no
  merges), then ``<bos>`` 256, ``<eos>`` 257, ``<pad>`` 258. posbench never reads a special token out of text,
  so neither does this one (``split_special_tokens``: the text ``<eos>`` is 5 bytes).
* ``char`` (arithmetic): ``[PAD]`` 0, ``[UNK]`` 1, ``[BOS]`` 2, ``[EOS]`` 3, then ``0123456789+-x=`` from 4; a space
  is ``[PAD]``, any other character ``[UNK]``. One token per character (a word-level model over single
  characters; a normaliser writes a space as ``[PAD]`` after turning ``[`` into an unknown character, so the
  text ``[PAD]`` is five unknowns, as in posbench).
* ``bpe``: the run's own ``tokenizers`` BPE, unchanged (special tokens ``<|pad|>`` 0, ``<|bos|>`` 1, ``<|eos|>`` 2;
  like posbench's, it reads them out of text).
* ``hf``: the run's Hugging Face tokenizer, saved as it is.

``posbench_tokenizer(spec, directory)`` reads an exported tokenizer back as posbench's own class.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Pipeline
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

import posbench.hf.modeling  # noqa: F401 - registers model_type 'posbench': AutoTokenizer reads config.json
from posbench.data.char import CHARS, CharTokenizer
from posbench.data.char import SPECIALS as CHAR_SPECIALS
from posbench.data.tokenizer import BPE_SPECIALS, BPETokenizer, ByteTokenizer, HFTokenizer, Tokenizer
from posbench.errors import UserError

BYTE_SPECIALS = ("<bos>", "<eos>", "<pad>")      # ids 256, 257, 258 (ByteTokenizer.BOS, EOS, PAD)


class TokenizerExportError(UserError):
    """A tokenizer that cannot be exported or read back; ``str()`` is one line."""


def spec_of(tokenizer) -> dict[str, Any]:
    """What an export records about its tokenizer (``posbench_export.json``)."""
    if isinstance(tokenizer, CharTokenizer):
        return {"kind": "char", "chars": tokenizer.chars, "vocab_size": tokenizer.vocab_size,
                "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id, "pad_id": tokenizer.pad_id}
    return dict(tokenizer.spec())


def hf_tokenizer(tokenizer):
    """The ``PreTrainedTokenizerFast`` (or, for ``hf``, the run's own tokenizer) to ``save_pretrained``."""
    if isinstance(tokenizer, ByteTokenizer):
        return _byte_tokenizer()
    if isinstance(tokenizer, CharTokenizer):
        return _char_tokenizer(tokenizer.chars)
    if isinstance(tokenizer, BPETokenizer):
        pad, bos, eos = BPE_SPECIALS
        return PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(tokenizer.tok), bos_token=bos, eos_token=eos,
                                       pad_token=pad)
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.hf
    raise TokenizerExportError(f"cannot export a tokenizer of kind {getattr(tokenizer, 'kind', type(tokenizer))!r}")


def _byte_tokenizer():
    symbol = bytes_to_unicode()                       # byte -> the printable character byte-level BPEs use
    pipeline = Pipeline(models.BPE(vocab={symbol[b]: b for b in range(256)}, merges=[]))
    pipeline.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    pipeline.decoder = decoders.ByteLevel()
    pipeline.add_special_tokens(list(BYTE_SPECIALS))  # appended: 256, 257, 258
    bos, eos, pad = BYTE_SPECIALS
    return PreTrainedTokenizerFast(tokenizer_object=pipeline, bos_token=bos, eos_token=eos, pad_token=pad,
                                   split_special_tokens=True)


def _char_tokenizer(chars: str):
    pad, unk, bos, eos = CHAR_SPECIALS
    vocab = {name: i for i, name in enumerate(CHAR_SPECIALS)}
    vocab.update({c: i + len(CHAR_SPECIALS) for i, c in enumerate(chars)})
    if "[" in chars or "?" in chars or " " in chars:
        raise TokenizerExportError(f"cannot export a character tokenizer over {chars!r}")
    pipeline = Pipeline(models.WordLevel(vocab=vocab, unk_token=unk))
    pipeline.normalizer = normalizers.Sequence([normalizers.Replace("[", "?"), normalizers.Replace(" ", pad)])
    pipeline.pre_tokenizer = pre_tokenizers.Split(Regex(r"\[PAD\]|[\s\S]"), behavior="isolated")
    pipeline.decoder = decoders.Fuse()
    pipeline.add_special_tokens(list(CHAR_SPECIALS))  # already in the vocabulary: ids 0-3
    return PreTrainedTokenizerFast(tokenizer_object=pipeline, bos_token=bos, eos_token=eos, pad_token=pad,
                                   unk_token=unk, split_special_tokens=True)


def posbench_tokenizer(spec: dict[str, Any], directory: Path) -> Tokenizer | CharTokenizer:
    """The exported tokenizer in ``directory`` as posbench's own class (``spec``: what the export recorded)."""
    kind = spec.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(spec.get("chars", CHARS))
    if kind == "bpe":
        return BPETokenizer.load(Path(directory) / BPETokenizer.FILE)
    if kind == "hf":
        return HFTokenizer.load(str(directory))
    raise TokenizerExportError(f"{directory}: unknown tokenizer kind {kind!r}")
