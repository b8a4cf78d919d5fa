"""Tokenizers for the language-model tasks: byte-level (default), a trained BPE, or a Hugging Face one.

``--tokenizer`` takes:

* ``byte`` (default): UTF-8 bytes 0-255 plus BOS=256, EOS=257, PAD=258; needs nothing, round-trips any text.
* ``bpe`` or ``bpe:VOCAB``: a byte-level BPE trained with ``tokenizers`` on the training split of the run's
  corpus and saved with the run as ``tokenizer.json`` (special tokens ``<|pad|>``=0, ``<|bos|>``=1,
  ``<|eos|>``=2); lossless on any text.
* anything else: a Hugging Face tokenizer by hub name or local path (a directory or a ``tokenizer.json``),
  loaded with ``transformers``; saved with the run under ``tokenizer/``. A hub name offline that is not in
  the local cache is a one-line error that says what to pass.

Every tokenizer has ``encode(text) -> list[int]`` (no special tokens), ``encode_batch``, ``decode(ids)``
(special tokens dropped), ``vocab_size``, ``bos_id``, ``eos_id``, ``pad_id``, ``spec()`` (a JSON-able
description recorded in the result) and ``save(run_dir)``; :func:`tokenizer_from_spec` reloads one from a
run directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTok
from tokenizers import decoders, models, pre_tokenizers, trainers

from posbench.data.errors import DataError
from posbench.data.hub_env import hub_offline
from posbench.data.hub_errors import explain
from posbench.data.progress import apply_to
from posbench.files import check_name

DEFAULT_BPE_VOCAB = 4096
BPE_SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")



class Tokenizer:
    """The interface every tokenizer implements."""

    kind = "base"
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def save(self, run_dir: str | Path) -> None:
        """Write whatever is needed to reload this tokenizer from ``run_dir`` (nothing for bytes)."""


class ByteTokenizer(Tokenizer):
    kind = "byte"
    BOS, EOS, PAD = 256, 257, 258

    def __init__(self):
        self.vocab_size = 259
        self.bos_id, self.eos_id, self.pad_id = self.BOS, self.EOS, self.PAD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def spec(self) -> dict[str, Any]:
        return {"kind": "byte", "vocab_size": self.vocab_size, "bos_id": self.bos_id, "eos_id": self.eos_id,
                "pad_id": self.pad_id}


class BPETokenizer(Tokenizer):
    """A byte-level BPE from the ``tokenizers`` library."""

    kind = "bpe"
    FILE = "tokenizer.json"

    def __init__(self, tok, trained_on: dict[str, Any] | None = None):
        self.tok = tok
        self.trained_on = trained_on or {}
        self.pad_id, self.bos_id, self.eos_id = (tok.token_to_id(s) for s in BPE_SPECIALS)
        if None in (self.pad_id, self.bos_id, self.eos_id):
            raise DataError(f"BPE tokenizer lacks the special tokens {', '.join(BPE_SPECIALS)}")
        self.vocab_size = tok.get_vocab_size()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB, min_frequency: int = 2,
              trained_on: dict[str, Any] | None = None) -> BPETokenizer:
        if vocab_size < 256 + len(BPE_SPECIALS):
            raise DataError(f"a byte-level BPE needs a vocabulary of at least {256 + len(BPE_SPECIALS)}, "
                            f"got {vocab_size}")
        tok = HFTok(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=list(BPE_SPECIALS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok, trained_on)

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        path = Path(path)
        if path.is_dir():
            path = path / cls.FILE
        if not path.is_file():
            raise DataError(f"no BPE tokenizer at {path}")
        meta_path = path.with_suffix(".meta.json")
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        return cls(HFTok.from_file(str(path)), meta.get("trained_on"))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def to_json(self) -> str:
        return self.tok.to_str()

    def spec(self) -> dict[str, Any]:
        return {"kind": "bpe", "vocab_size": self.vocab_size, "bos_id": self.bos_id, "eos_id": self.eos_id,
                "pad_id": self.pad_id, "file": self.FILE,
                "sha256": hashlib.sha256(self.to_json().encode("utf-8")).hexdigest(),
                "trained_on": self.trained_on}

    def save(self, run_dir: str | Path) -> None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(run_dir / self.FILE, self.to_json())
        _atomic_write((run_dir / self.FILE).with_suffix(".meta.json"),
                      json.dumps({"trained_on": self.trained_on}, indent=2))


class HFTokenizer(Tokenizer):
    """A ``transformers`` tokenizer (hub name, local directory or ``tokenizer.json``)."""

    kind = "hf"
    DIR = "tokenizer"

    def __init__(self, hf, name: str):
        self.hf, self.name = hf, name
        self.vocab_size = len(hf)
        eos = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
        if eos is None:
            raise DataError(f"tokenizer '{name}' has no EOS (or SEP) token; posbench needs one to separate documents")
        self.eos_id = int(eos)
        self.bos_id = int(hf.bos_token_id) if hf.bos_token_id is not None else (
            int(hf.cls_token_id) if hf.cls_token_id is not None else self.eos_id)
        self.pad_id = int(hf.pad_token_id) if hf.pad_token_id is not None else self.eos_id

    @classmethod
    def load(cls, name_or_path: str) -> HFTokenizer:
        path = Path(os.path.expanduser(name_or_path))
        try:
            import transformers  # transformers: only a Hugging Face tokenizer needs it

            apply_to(transformers)
            if path.is_file():
                hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
                if hf.eos_token_id is None:
                    for candidate in ("<|endoftext|>", "</s>", "<|eos|>", "<eos>", "[SEP]"):
                        if candidate in hf.get_vocab():
                            hf.eos_token = candidate
                            break
            elif path.is_dir():
                hf = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                                trust_remote_code=False)
            else:
                hf = transformers.AutoTokenizer.from_pretrained(name_or_path, local_files_only=hub_offline(),
                                                                trust_remote_code=False)
        except DataError:
            raise
        except Exception as exc:   # noqa: BLE001 - offline, unknown name, bad files: one line
            if "trust_remote_code" in str(exc):     # never asked, never run (trust_remote_code=False)
                raise DataError(f"cannot load tokenizer '{name_or_path}': it needs its own Python code "
                                f"(auto_map, trust_remote_code), which posbench never runs; pass a tokenizer that "
                                f"needs none (a tokenizer.json), --tokenizer byte or --tokenizer bpe") from None
            message = None if path.exists() else explain(exc, name_or_path, repo_type="model", offline=None)
            if message:                              # gated / not found keep their meaning
                raise DataError(f"cannot load tokenizer '{name_or_path}': {message}") from None
            first = (str(exc).splitlines() or [""])[0][:200]
            where = f"{type(exc).__name__}: {first}" if path.exists() else \
                "offline and not in the local cache" if hub_offline() else type(exc).__name__
            raise DataError(f"cannot load tokenizer '{name_or_path}' ({where}): pass --tokenizer byte, "
                            f"--tokenizer bpe (trained on the corpus), or a local directory / tokenizer.json "
                            f"with --tokenizer PATH") from None
        return cls(hf, name_or_path)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(ids) for ids in self.hf(list(texts), add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

    def spec(self) -> dict[str, Any]:
        return {"kind": "hf", "name": self.name, "class": type(self.hf).__name__, "vocab_size": self.vocab_size,
                "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id, "dir": self.DIR}

    def save(self, run_dir: str | Path) -> None:
        self.hf.save_pretrained(str(Path(run_dir) / self.DIR))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def parse_bpe_spec(spec: str) -> int | None:
    """``bpe`` -> the default vocabulary, ``bpe:8192`` -> 8192, anything else -> None."""
    spec = spec.strip().lower()
    if spec == "bpe":
        return DEFAULT_BPE_VOCAB
    if spec.startswith("bpe:"):
        try:
            return int(spec[4:])
        except ValueError:
            raise DataError(f"bad tokenizer '{spec}': use bpe or bpe:VOCAB_SIZE, e.g. bpe:4096") from None
    return None


def build_tokenizer(spec: str | None, train_texts: Callable[[], Iterable[str]] | None = None,
                    trained_on: dict[str, Any] | None = None) -> Tokenizer:
    """Resolve ``--tokenizer SPEC``. ``train_texts`` supplies the corpus a BPE is trained on."""
    spec = (spec or "byte").strip()
    if spec.lower() in ("byte", "bytes"):
        return ByteTokenizer()
    vocab = parse_bpe_spec(spec)
    if vocab is not None:
        if train_texts is None:
            raise DataError("--tokenizer bpe needs a training corpus; this task has none (use --tokenizer byte)")
        return BPETokenizer.train(train_texts(), vocab_size=vocab, trained_on=trained_on)
    return HFTokenizer.load(spec)


def tokenizer_from_spec(spec: dict[str, Any], run_dir: str | Path) -> Tokenizer:
    """Reload the tokenizer a run recorded (``spec``) from its directory."""
    kind = spec.get("kind")
    run_dir = Path(run_dir)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        name = check_name(spec.get("file", BPETokenizer.FILE), f"{run_dir}: the recorded tokenizer file", DataError)
        tok = BPETokenizer.load(run_dir / name)
        if spec.get("sha256") and tok.spec()["sha256"] != spec["sha256"]:
            raise DataError(f"{run_dir / BPETokenizer.FILE} does not match the tokenizer its run recorded")
        return tok
    if kind == "hf":
        local = run_dir / check_name(spec.get("dir", HFTokenizer.DIR), f"{run_dir}: the recorded tokenizer directory",
                                     DataError)
        return HFTokenizer.load(str(local) if local.is_dir() else spec["name"])
    raise DataError(f"{run_dir}: unknown tokenizer kind {kind!r}")
