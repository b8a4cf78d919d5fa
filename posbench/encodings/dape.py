"""DAPE (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation",
arXiv 2405.14722): a small MLP over every head's attention logit and base bias adjusts the logits.

For query i and key j, with H heads, the logits of all heads ``L_ij = (q_ih . k_jh / sqrt(D))_h`` and a base
bias ``B_ij = (b_h(i, j))_h`` (ALiBi, FIRE, ...), the paper's DAPE attention with its residual form (Section 3) is

    A_ij = L_ij + B_ij + f([L_ij, B_ij]),    f(u) = W2 LeakyReLU(W1 u + b1) + b2,

f an MLP from the 2H channels of one (i, j) pair to H (hidden size ``hidden``, the paper's D_DAPE = 32), the
same f at every (i, j), one f per layer. This encoding's logit bias is ``B_ij + f([L_ij, B_ij])``; attention
adds ``L_ij`` itself. Because f acts on each (i, j) alone, a key right of the causal diagonal never changes a
visible score, and a KV cache stays exact (new queries against every cached key).

Where the paper leaves a choice open, this follows the released code (chuanyang-zheng/DAPE,
``megatron/model/positional_embeddings.py``, ``AliBi_C`` / ``FIRE_C`` / ``ParallelKerpleLog_C``; base ``kerple``
is posbench's KERPLE, log kernel by default):
- the logits fed to f are the raw scores already scaled by 1/sqrt(D) (``baddbmm(..., alpha=1/norm_factor)``
  before the bias is applied), unmasked (the causal mask comes after);
- the concatenation is [logits of the H heads, base bias of the H heads], in that order; f is
  Linear(2H, hidden), LeakyReLU (slope 0.01), Linear(hidden, H), with biases, one per layer;
- f keeps PyTorch's default ``nn.Linear`` initialisation (the released ``AliBi_C`` / ``FIRE_C`` build plain
  ``nn.Linear`` layers, which Megatron's model-wide init never reaches): weights and biases U(-1/sqrt(fan_in),
  1/sqrt(fan_in)), so f moves the logits by a fraction of a unit from the first step;
- every attention layer has its own base: the released code builds ``ParallelKerpleLog_C`` and ``FIRE_C`` inside
  each attention layer (``megatron/model/transformer.py``), so DAPE-KERPLE learns one (r1, r2) pair per layer
  (option ``base_per_layer``, default true; false shares one pair, posbench's KERPLE default). FIRE is per layer
  either way and ALiBi has no parameters;
- DAPE-FIRE's threshold starts at L = 64: the released configurations (``configs/125M/512/125M_fire_c.yml``,
  ``noise_seq_length: 128``) give ``FIRE_C`` ``init_L = noise_seq_length = 128``, which it stores as
  ``init_L // 2 = 64`` (option ``fire_init_l``, default 64; posbench's FIRE on its own starts at half
  the training length).

The base bias is an option (``base``), computed by that encoding's own ``bias`` hook (one instance of it, with
its default options but for the two above, lives inside this module), so ALiBi's slopes and FIRE's learned MLP are
those encodings' code. A base is any encoding with an element-wise bias named in ``BASES``; adding one is adding
its name. The released code's FIRE_C uses LeakyReLU inside FIRE's own MLP; here FIRE is posbench's FIRE (ReLU),
unchanged.

Cost: f runs on every (i, j) of every layer, so DAPE materialises ``[B, hidden, Nq * Nk]`` per layer (the MLP's
hidden layer, kept for the backward: 512 MiB at 2048 tokens and hidden 32, float32). The first layer is split as
``W1 [L; B] = W1_L L + (W1_B B + b1)``: the base part is computed once for all rows of the batch when they share
their positions; each layer is a batched matmul over the flattened (i, j) axis, in the attention's own layout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.encodings.base import ENCODINGS, PositionalEncoding
from posbench.options import OneOf, Option, at_least, positive

#: encodings whose element-wise bias (a ``ScoreBias``) can be DAPE's base
BASES = ("alibi", "fire", "kerple")
#: LeakyReLU's negative slope (``nn.LeakyReLU()``'s default, as in the released code)
NEGATIVE_SLOPE = 0.01


class DAPELayer(nn.Module):
    """f for one layer: Linear(2H, hidden), LeakyReLU, Linear(hidden, H), and the base bias added back."""

    def __init__(self, n_heads: int, hidden: int):
        super().__init__()
        self.n_heads = n_heads
        self.up = nn.Linear(2 * n_heads, hidden)
        self.down = nn.Linear(hidden, n_heads)

    def forward(self, logits: Tensor, base: Tensor) -> Tensor:
        """``base + f([logits, base])`` for logits ``[B, H, Nq, Nk]`` and the base bias ``[B or 1, H, Nq, Nk]``.

        Computed channels-first, as two batched matmuls over the flattened (i, j) axis, with no permutation:
        ``hidden = W1_B base + b1 + W1_L logits`` (the base part, shared by the rows when the base is, is the
        matmul's added input) and ``base + b2 + W2 LeakyReLU(hidden)``."""
        b, h, nq, nk = logits.shape
        dtype = logits.dtype
        w1, b1 = self.up.weight.to(dtype), self.up.bias.to(dtype)
        w2, b2 = self.down.weight.to(dtype), self.down.bias.to(dtype)
        hidden_size = w1.shape[0]
        base = base.to(dtype).reshape(base.shape[0], h, nq * nk)
        from_base = torch.baddbmm(b1[None, :, None], w1[:, h:].expand(base.shape[0], hidden_size, h), base)
        hidden = torch.baddbmm(from_base, w1[:, :h].expand(b, hidden_size, h), logits.reshape(b, h, nq * nk))
        hidden = F.leaky_relu(hidden, NEGATIVE_SLOPE)
        out = torch.baddbmm(base + b2[None, :, None], w2.expand(b, h, hidden_size), hidden)
        return out.view(b, h, nq, nk)


class DAPE(PositionalEncoding):
    name = "dape"
    description = "data-adaptive: an MLP over every head's logit and base bias (alibi or fire) adjusts the logits"
    bias_from_qk = True
    OPTIONS = {
        "base": Option("alibi", "the base bias: an encoding with an element-wise bias", OneOf(BASES)),
        "hidden": Option(32, "hidden size of the MLP over every head's logit and base bias (the paper's D_DAPE)",
                         at_least(1)),
        "base_per_layer": Option(True, "each layer its own base parameters (KERPLE's r1, r2), as the released code; "
                                       "false: one pair shared by every layer"),
        "fire_init_l": Option(64.0, "base fire: the threshold L's initial value (the released code: init_L // 2 = "
                                    "64 from its noise length 128)", positive()),
    }

    def __init__(self, n_layers: int, n_heads: int, head_dim: int, d_model: int, max_seq_len: int, **options):
        super().__init__(n_layers, n_heads, head_dim, d_model, max_seq_len, **options)
        base = ENCODINGS.get(self.options["base"])
        self.base = base(n_layers, n_heads, head_dim, d_model, max_seq_len, **self.base_options(base))
        self.layers = nn.ModuleList(DAPELayer(n_heads, self.options["hidden"]) for _ in range(n_layers))

    def base_options(self, base: type) -> dict:
        """The base's options that DAPE sets as the released code does (the others keep their defaults):
        ``per_layer`` (KERPLE) from ``base_per_layer``, ``init_l`` (FIRE) from ``fire_init_l``."""
        ours = {"per_layer": self.options["base_per_layer"], "init_l": self.options["fire_init_l"]}
        return {key: value for key, value in ours.items() if key in base.OPTIONS}

    def init_weights(self) -> None:
        self.base.embedding_std = self.embedding_std
        self.base.init_weights()

    def init_state(self, positions: Tensor, tokens: Tensor, memory):
        """The base's own state (KERPLE projects its parameters back into range here, once per forward pass)."""
        return self.base.init_state(positions, tokens, memory)

    def base_bias(self, layer: int, state, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The base encoding's bias ``[B or 1, H, Nq, Nk]`` (its own ``ScoreBias``, materialised)."""
        return self.base.bias(layer, state, None, None, q_pos, k_pos).materialise(self.n_heads, q_pos, k_pos)

    def bias(self, layer: int, state, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)         # float32 at least, autocast or not
        with torch.autocast(q.device.type, enabled=False):
            logits = (q.to(dtype) * (1.0 / math.sqrt(self.head_dim))) @ k.to(dtype).transpose(-2, -1)
            return self.layers[layer](logits, self.base_bias(layer, state, q_pos, k_pos))
