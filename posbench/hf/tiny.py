"""A tiny random Llama with a tokenizer, saved like a pretrained one: for tests and for trying
``posbench extend`` without a download.

The tokenizer is a byte-level BPE trained with ``tokenizers`` on the passkey template's sentences and a few
lines of code (a few hundred tokens; lossless on any text), wrapped as a ``PreTrainedTokenizerFast`` with
``<s>``, ``</s>`` and ``<pad>``. The model is ``LlamaForCausalLM(LlamaConfig(...))`` with random weights.

    python -m posbench.hf.tiny DIR [--layers 2] [--heads 4] [--kv-heads 4] [--max-positions 64]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from posbench.evaluation import passkey as pk
from posbench.hf.loading import _quiet

SPECIALS = ("<s>", "</s>", "<pad>")


def _training_text() -> list[str]:
    return [pk.TASK_DESCRIPTION, pk.GARBAGE * 4, pk.information_line(12345), pk.QUESTION, " 0123456789" * 8,
            "def main(argv):\n    return [x for x in range(10) if x % 2 == 0]\n",
            "class Model:\n    def __init__(self, name):\n        self.name = name\n"]


def tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE ``PreTrainedTokenizerFast`` (BOS ``<s>``, EOS ``</s>``, PAD ``<pad>``)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_training_text(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def tiny_config(vocab_size: int, *, hidden_size: int = 32, layers: int = 2, heads: int = 4, kv_heads: int | None = None,
                intermediate_size: int = 64, max_positions: int = 64, rope_theta: float = 10000.0,
                initializer_range: float = 0.02, rms_norm_eps: float = 1e-5, attention: str = "sdpa"):
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads or heads, max_position_embeddings=max_positions,
                       rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
                       initializer_range=initializer_range, rms_norm_eps=rms_norm_eps, tie_word_embeddings=False,
                       bos_token_id=0, eos_token_id=1, pad_token_id=2, attn_implementation=attention)


def save_tiny_llama(directory: str | Path, *, seed: int = 0, **config) -> Path:
    """Write a random tiny Llama and its tokenizer to ``directory`` (save_pretrained layout)."""
    _quiet()
    directory = Path(directory)
    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(len(tokenizer), **config))
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random Llama and its tokenizer to DIR.")
    parser.add_argument("directory")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--max-positions", type=int, default=64)
    parser.add_argument("--force", action="store_true", help="replace DIR when it already holds files")
    args = parser.parse_args(argv)
    target = Path(args.directory)
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not args.force)):
        print(f"error: {target} already exists{'' if target.is_dir() else ' and is not a directory'}; "
              f"{'pass --force to replace it, or ' if target.is_dir() else ''}choose a new directory",
              file=sys.stderr)
        raise SystemExit(2)
    if target.is_dir() and args.force:
        shutil.rmtree(target)
    path = save_tiny_llama(args.directory, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                           hidden_size=args.hidden, max_positions=args.max_positions)
    print(path)


if __name__ == "__main__":
    main()
