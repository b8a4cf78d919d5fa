"""Abacus embeddings (McLeish et al., 2024, "Transformers Can Do Arithmetic with the Right Embeddings",
arXiv 2405.17399): a learned embedding of each digit's place inside its number, added to the input embeddings.

Each token i gets a digit index a_i: 0 if it is not a digit, else one more than the previous token's index, so
the first digit of a number (in the order the task writes its digits: least significant first in the
arithmetic task) has index 1, the next 2, and so on. The input of the first layer is

    x_i = E_tok[t_i] + E_abacus[ min(a_i + k * [a_i > 0], R - 1) ],    a_i = [t_i is a digit] * (a_{i-1} + 1)

with a learned table E_abacus of R = max_k + max_digits + 1 rows (row 0 is the one every non-digit token
reads). While training, k ~ U{0..max_k} is drawn anew for every batch (or every example: ``per_example``) and
added to every digit index, so that rows up to max_k + (the training length of a number) are
trained and a longer number at evaluation still finds trained rows; at evaluation k = 0. The equation is
written here from the paper's description and the authors' code (``abacus.py`` and
``cramming/architectures/embeddings.py`` of mcleish7/arithmetic, read at 55af9d5); the code below is ours.

Digits are the token ids in ``digit_ids`` (the ids of 0-9 in the task's vocabulary). Only a task can know
them: the option is declared ``from_task=True`` and the run configuration fills it from the task's
``Task.encoding_context()`` (the arithmetic task gives its character tokenizer's ids 4-13); a task without
digits refuses this encoding before anything runs, and building the encoding without ``digit_ids`` is an
error.

With a KV cache one forward pass sees only the new tokens; the run length at the last token of every row is
left in the cache's ``memory`` (and, while training, each row's offset k), so a digit continues the count of
the number it extends: cached decoding equals recomputation.

Choices the paper leaves open, and where we differ from the released code:
- ``max_k`` is the largest offset: k ~ U{0..max_k}. The released code's ``random.randint(0, max_k)`` with its
  max_k = 99 ("99 as we add it on after", its comment says) puts the first digit of a training number at 1..100:
  the paper's k = 100, chosen so that the rows read by numbers of up to 100+ digits (the paper's test lengths,
  after training on 20) have been trained. The rule, not the number, is the method: by default (``max_k = -1``)
  the offset is the least that covers the task's longest number at evaluation, its digits minus the training's
  longest (``number_digits``, which the task gives: the arithmetic task's sums, ``[train_digits + 1,
  eval_digits + 1]``, so 5 for 5 -> 10-digit operands), and the release's 99 where the task gives no lengths.
  An offset range far wider than the evaluation needs spreads the training of short numbers over rows no test
  reads: at 5-digit training (4,000 steps, 4 x 64) max_k = 99 left Abacus at 5% in distribution
  (docs/studies/arithmetic/4k.md). The resolved value is what a run records. Range >= 0, or -1.
- ``per_example`` (default False): the paper does not say whether k is drawn per example or per batch; the
  released code draws ONE k per forward pass (Python ``random.randint``) shared by the whole batch, and so do
  we by default (with torch's generator on the tokens' device: no Python ``random``, no host sync, no graph
  break). ``per_example=true`` draws one k per example instead.
- ``max_digits`` (default 0: the model's ``max_seq_len``; a number can be no longer than the training
  sequence) sets the table to max_k + max_digits + 1 rows, so every digit of a number of up to max_digits
  digits has its own row, offset included. A digit further into its number (possible only at a length beyond
  max_seq_len, or with a smaller max_digits) reads the last row: the index is clamped. The released code has
  no such check: its ``nn.Embedding(1024)`` raises an IndexError on a CPU (a device-side assert on CUDA) past
  row 1023. A clamp keeps the hook free of host syncs (a clear error would need one per forward pass).
- The table's init (``init_std``, default 0: the model's token-embedding std). The release draws the token
  embeddings and this table from one N(0, d_model ** -0.5): what it fixes is their ratio, 1, since the table is
  added to a token's embedding and the sum is normalised before attention. posbench's token embeddings are N(0,
  model.init_std), 0.02 by default, so the table is drawn so too. Drawn at the release's absolute std (0.125 at
  d_model 64, six times a token's), the digit places drown the digits: on the arithmetic study's cell (seed 0,
  4,000 steps) Abacus stalled at 42.6% in distribution; at the token embeddings' std it reached 99.1%
  (docs/studies/arithmetic/4k.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from posbench.encodings.base import ENCODINGS, PositionalEncoding
from posbench.options import Added, Bound, Each, OneOf, Option, OptionError, at_least

RUN, OFFSET = "abacus.run", "abacus.offset"     # keys of this encoding's entries in a KV cache's memory
RELEASED_MAX_K = 99                             # mcleish7/arithmetic: random.randint(0, 99), the paper's k = 100


def covering_offset(number_digits: list[int]) -> int:
    """The least ``max_k`` whose trained rows cover the longest number at evaluation: its digits minus the
    training's longest (``[train, eval]``, as the task gives them); the release's 99 without them."""
    if len(number_digits) != 2:
        return RELEASED_MAX_K
    train, evaluation = number_digits
    return max(0, int(evaluation) - int(train))


class Abacus(PositionalEncoding):
    name = "abacus"
    description = "learned embedding of each digit's place in its number, random offset in training (arithmetic)"
    OPTIONS = {
        "digit_ids": Option([], "the token ids of the digits 0-9", Each(at_least(0), min_items=0), from_task=True),
        "max_k": Option(-1, "the largest random offset k ~ U{0..max_k} added while training; -1: the least that "
                            "covers the task's longest number at evaluation (the release's 99 where the task gives "
                            "no lengths)", at_least(-1)),
        "number_digits": Option([], "the longest number in training and at evaluation, in digits (the task gives "
                                    "them)", Each(at_least(1), min_items=0), from_task=True, task_optional=True),
        "max_digits": Option(0, "table rows for numbers of up to this many digits (0: max_seq_len)", at_least(0)),
        "per_example": Option(False, "draw k once per example (default: once per batch, as the released code)"),
        "init_std": Option(0.0, "std of the table's N(0, std) init (0: the token embeddings' std, model.init_std, "
                                "as the release draws both from one distribution)", Bound(low=0)),
        "attention_bias": Option("none", "a relative bias in attention beside the digit places: none (Abacus alone, "
                                         "attention without positions) or fire (McLeish et al.'s Abacus + FIRE)",
                                 OneOf(("none", "fire")), added=Added(2, "none")),
        "fire_init_l": Option(0.0, "with attention_bias=fire: FIRE's initial L (0: FIRE's own default, half the "
                                   "training length; the arithmetic releases: 512)", Bound(low=0), added=Added(2, 0.0)),
    }

    @classmethod
    def resolve(cls, given: dict[str, Any]) -> dict[str, Any]:
        """The options, with ``max_k = -1`` made the offset it stands for (recorded so, and read by the model)."""
        options = super().resolve(given)
        if options["max_k"] == -1:
            options["max_k"] = covering_offset(options["number_digits"])
        return options

    @classmethod
    def check_options(cls, options) -> None:
        if options["fire_init_l"] and options["attention_bias"] != "fire":
            raise OptionError("encoding 'abacus' option fire_init_l sets FIRE's L, which only attention_bias=fire "
                              "adds: set encoding.attention_bias=fire, or leave fire_init_l at 0")
        ids = options["digit_ids"]
        if not ids:
            raise OptionError("encoding 'abacus' needs digit_ids (the token ids of the digits 0-9), which "
                              "the task gives: it runs on tasks whose tokens are digits (posbench run "
                              "--task arithmetic)")
        if len(ids) != 10 or len(set(ids)) != 10:
            raise OptionError(f"encoding 'abacus' option digit_ids={ids!r}: expected the 10 distinct token "
                              f"ids of the digits 0-9")

    def __init__(self, n_layers: int, n_heads: int, head_dim: int, d_model: int, max_seq_len: int, **options):
        super().__init__(n_layers, n_heads, head_dim, d_model, max_seq_len, **options)
        o = self.options
        self.max_digits = o["max_digits"] or max_seq_len
        self.rows = o["max_k"] + self.max_digits + 1
        self.table = nn.Embedding(self.rows, d_model)
        if o["attention_bias"] == "fire":
            # McLeish et al.'s Abacus + FIRE: FIRE's own module, options, init and bias hook (encodings/fire.py).
            # The hook is this instance's alone: the class keeps the base class's none, so the default Abacus
            # carries one signal (the digit places), as the encoding contract asks.
            self.fire = ENCODINGS.get("fire")(n_layers, n_heads, head_dim, d_model, max_seq_len,
                                              init_l=o["fire_init_l"])
            self.bias = self.fire.bias
        self.register_buffer("digits", torch.tensor(o["digit_ids"], dtype=torch.long), persistent=False)

    def init_weights(self) -> None:
        """As released, the table is drawn like the token embeddings it is added to: the paper's runs
        (``init.type: deepnorm-straight``) draw every embedding, token and Abacus alike, from one N(0, d_model **
        -0.5) (cramming's ``_init_module``); posbench draws its token embeddings from N(0, model.init_std), and so
        this table (``init_std`` sets another std)."""
        nn.init.normal_(self.table.weight, std=self.options["init_std"] or self.embedding_std)
        if self.options["attention_bias"] == "fire":
            self.fire.init_weights()

    # ---- the digit index --------------------------------------------------------------------------------
    def digit_runs(self, tokens: Tensor, carry: Tensor | None = None) -> Tensor:
        """``a_i`` of the module docstring for tokens ``[B, N]``: 0 for a non-digit, else the digit's place in
        its number (1, 2, ...); ``carry [B]``: the run length just before the first token (a KV cache's)."""
        is_digit = (tokens[..., None] == self.digits).any(-1)
        index = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        last_other = torch.where(is_digit, -1, index).cummax(dim=1).values     # the last non-digit so far, or -1
        run = index - last_other
        if carry is not None:                          # a number continued from the cached tokens
            run = run + torch.where(last_other < 0, carry[:, None], 0)
        return torch.where(is_digit, run, 0)

    def draw_offset(self, batch: int, device: torch.device) -> Tensor:
        """k ~ U{0..max_k}: ``[B, 1]``, one for the whole batch (the default) or one per example (``per_example``)."""
        rows = batch if self.options["per_example"] else 1
        k = torch.randint(0, self.options["max_k"] + 1, (rows, 1), device=device)
        return k.expand(batch, 1)

    # ---- hooks --------------------------------------------------------------------------------------------
    def init_state(self, positions: Tensor, tokens: Tensor, memory: dict[str, Tensor] | None) -> Tensor:
        """The state: each token's row of the table ``[B, N]`` (offset included while training)."""
        carry = memory.get(RUN) if memory is not None else None
        runs = self.digit_runs(tokens, carry)
        if memory is not None:
            memory[RUN] = runs[:, -1].clone(memory_format=torch.contiguous_format)   # one stride: one compiled step
        if self.training:
            offset = memory.get(OFFSET) if memory is not None else None
            if offset is None:
                offset = self.draw_offset(tokens.shape[0], tokens.device)
                if memory is not None:
                    memory[OFFSET] = offset
            runs = torch.where(runs > 0, runs + offset, 0)
        return runs.clamp(max=self.rows - 1)

    def embed(self, x: Tensor, state: Tensor) -> Tensor:
        return x + self.table(state).to(x.dtype)
