"""TAPE (Zhu et al., ICML 2025): contextualised, orthogonally equivariant positional encoding.

The positional state is a pair (C, S), each [B, H, N, D], initialised from RoPE's cos/sin table (every head
the same). For each head, frequency f and token, the four numbers C_f, S_f, C_{f+F}, S_{f+F} form a 2x2
matrix E = [[C_f, -S_f], [S_{f+F}, C_{f+F}]] that rotates the (q_f, q_{f+F}) pair, so the logits depend on
the state only through E_i^T E_j.

Per layer:
1. logits from q~ = q*C + rotate_half(q)*S and k~ likewise (as RoPE, with a per-token, per-head table);
2. attention-side update: C <- C + s_h * (A C), S <- S + s_h * (A S), where A is this layer's causal
   attention matrix. [C | S] are concatenated to V, so one attention pass aggregates both, and gradients
   are exact autograd gradients;
3. MLP-side update, fed by the MLP output m: g = SiLU(m W_x^T) [N, I];
   dE[h] = sum_p W_down[h, p] g[p] sum_h' W_up[p, h'] E[h'], applied to C and S with the same weights.
Both updates are linear in E with coefficients that do not see the 2x2 entries, so they commute with any
O(2) matrix applied to every block: the encoding is orthogonally equivariant. W_up and the gate start at
zero, so a fresh TAPE model computes exactly what RoPE computes.

Deliberate choices, each an option:
- ``gate`` = "rowsum" (default) keeps the reference's H x H weight whose einsum sums each row into one
  scalar per head (its training dynamics: Adam moves the effective gate H times faster); "scalar" uses one
  parameter per head.
- ``random_offset`` (default True, as the reference): while training, all positions are shifted by one
  random k ~ U{0..2 * max_seq_len} per forward pass. The RoPE baseline has the same option, off by default.
- ``position_size`` I (default 0 = 4 x heads), ``theta`` 10000, ``scale`` 1 (linear position interpolation).

The state after the last layer is discarded (as in the reference), so the last layer neither appends the
state to its values nor updates it. Its TAPE parameters exist, so the parameter count is the paper's
L * (d_model*I + 2*H*I + H*H), but they never reach the loss: ``init_weights`` freezes them.

The tied state. The state starts as RoPE's table, whose two halves are equal (C_f = C_{f+F}, S_f = S_{f+F}),
and both updates apply the same coefficients to every channel, so the halves stay equal for ever. The state
is therefore carried tied: ``[c | s]``, each half of C and S, ``[B, H, N, D]`` instead of ``[B, H, N, 2D]``,
which halves what is appended to the values and what the MLP-side update mixes. ``rotate`` also takes the
untied ``[C | S]`` layout (``untie(state)``), which a state that was transformed with a reflection needs
(its halves differ); every other hook works on either width alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.encodings.base import PositionalEncoding, rope_angles, rotate_half
from posbench.options import OneOf, Option, at_least, positive
from posbench.encodings.rope import training_offset


#: the reference's initializer_range, which its x_proj and down_proj are drawn with
RELEASED_STD = 0.02


class TAPELayer(nn.Module):
    """The per-layer parameters: the attention-side gate and the MLP-side update (all bias-free)."""

    def __init__(self, d_model: int, n_heads: int, position_size: int, gate: str):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(n_heads, n_heads) if gate == "rowsum" else torch.zeros(n_heads))
        self.x_proj = nn.Linear(d_model, position_size, bias=False)
        self.up_proj = nn.Linear(n_heads, position_size, bias=False)
        self.down_proj = nn.Linear(position_size, n_heads, bias=False)

    def head_gate(self) -> Tensor:
        return self.gate.sum(-1) if self.gate.dim() == 2 else self.gate

    def mlp_update(self, mlp_out: Tensor, state: Tensor) -> Tensor:
        """dE for a state ``[B, H, N, W]`` (any width W: every channel is treated alike) from the MLP output
        ``[B, N, d_model]``.

        dE[h] = sum_p W_down[h, p] g[p] sum_h' W_up[p, h'] E[h'] = sum_h' M[h, h'] E[h'], with one H x H
        mixing matrix per token, M = W_down diag(g) W_up: the same sum, without an I-channel copy of the state.
        """
        g = F.silu(self.x_proj(mlp_out))                                        # [B, N, I]
        mix = (self.down_proj.weight * g[..., None, :]) @ self.up_proj.weight   # [B, N, H, H]
        return (mix @ state.transpose(1, 2)).transpose(1, 2)                    # [B, N, H, W] -> [B, H, N, W]


def rotate_by_state(x: Tensor, state: Tensor) -> Tensor:
    """``x [..., D]`` rotated by a TAPE state of the same dtype: tied ``[c | s]`` (width D: each pair
    (x_f, x_{f+D/2}) turned by (c_f, s_f)) or untied ``[C | S]`` (width 2D: x * C + rotate_half(x) * S)."""
    if state.shape[-1] == x.shape[-1]:
        c, s = state.chunk(2, dim=-1)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    cos, sin = state.chunk(2, dim=-1)
    return x * cos + rotate_half(x) * sin


def untie(state: Tensor) -> Tensor:
    """The tied state ``[c | s]`` ``[..., D]`` as the full ``[C | S]`` ``[..., 2D]``, halves duplicated."""
    c, s = state.chunk(2, dim=-1)
    return torch.cat((c, c, s, s), dim=-1)


class TAPE(PositionalEncoding):
    name = "tape"
    one_pass = True           # the last layer's update is frozen and skipped: it would feed a second pass
    description = "contextualised equivariant positional encoding (RoPE-initialised state updated per layer)"
    OPTIONS = {
        "position_size": Option(0, "I, the width of the MLP-side update (0: 4 x heads)", at_least(0)),
        "gate": Option("rowsum", "rowsum: the reference's H x H gate summed per row; scalar: one per head",
                       OneOf(("rowsum", "scalar"))),
        "random_offset": Option(True, "while training, shift every position by one k ~ U{0..2 max_seq_len} (the "
                                      "reference)"),
        "theta": Option(10000.0, "the rotary base of the initial state", positive()),
        "scale": Option(1.0, "positions are divided by this (linear position interpolation)", positive()),
    }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.options["position_size"] <= 0:
            self.options["position_size"] = 4 * self.n_heads
        self.layers = nn.ModuleList(
            TAPELayer(self.d_model, self.n_heads, self.options["position_size"], self.options["gate"])
            for _ in range(self.n_layers))

    def init_weights(self) -> None:
        """As the reference (``adape.py`` ``_init_weights``): x_proj and down_proj N(0, 0.02), its model-wide
        initializer_range; up_proj and the gate zero, so both updates start at zero: a fresh TAPE model is RoPE."""
        for layer in self.layers:
            nn.init.normal_(layer.x_proj.weight, std=RELEASED_STD)
            nn.init.normal_(layer.down_proj.weight, std=RELEASED_STD)
            nn.init.zeros_(layer.gate)
            nn.init.zeros_(layer.up_proj.weight)
        for param in self.layers[self.n_layers - 1].parameters():   # the last layer's state is discarded
            param.requires_grad_(False)

    def init_state(self, positions: Tensor, tokens: Tensor, memory) -> Tensor:
        """The tied state ``[B, H, N, D]`` = [cos | sin] of RoPE's angles (D/2 each), every head alike."""
        positions = training_offset(self, positions, self.options["random_offset"], self.max_seq_len)
        angles = rope_angles(positions.to(torch.float64) / self.options["scale"], self.head_dim,
                             self.options["theta"])
        state = torch.cat((angles.cos(), angles.sin()), dim=-1).to(torch.float32)   # [B, N, D]
        return state[:, None].expand(-1, self.n_heads, -1, -1)

    def rotate(self, layer: int, q: Tensor, k: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        state = state.to(q.dtype)
        return rotate_by_state(q, state), rotate_by_state(k, state)

    def is_last(self, layer: int) -> bool:
        """The state after the last layer is discarded, so that layer's updates are skipped."""
        return layer == self.n_layers - 1

    def state_values(self, layer: int, state: Tensor) -> Tensor | None:
        return None if self.is_last(layer) else state

    def after_attention(self, layer: int, state: Tensor, aggregated: Tensor) -> Tensor:
        gate = self.layers[layer].head_gate().to(aggregated.dtype)
        return state + gate[None, :, None, None] * aggregated

    def after_mlp(self, layer: int, state: Tensor, mlp_out: Tensor) -> Tensor:
        if self.is_last(layer):
            return state
        return state + self.layers[layer].mlp_update(mlp_out, state.to(mlp_out.dtype))

    def added_parameters(self) -> int:
        """Per the reference formula: L * (d_model*I + 2*H*I + H*H) for the row-sum gate."""
        return sum(p.numel() for p in self.layers.parameters())
