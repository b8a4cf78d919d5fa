"""TAPE inside a Hugging Face Llama: the model keeps its weights; three module swaps add TAPE.

TAPE (``posbench.encodings.tape``, whose docstring writes out the layer; Zhu et al., ICML 2025, arXiv:2501.00712,
and its release VITA-Group/TAPE 466d9e6 ``models/llama/adape.py``) carries a positional state (C, S),
``[B, H, N, D]`` each, next to the hidden states. Llama's rotary table repeats its D/2 angles in
both halves, as posbench's own RoPE table does, so the state is carried tied as posbench's TAPE carries it:
``[c | s]``, ``[B, H, N, D]``, half of C and half of S (every update treats the channels alike, so the halves
stay equal). A table whose halves differ (checked on the first pass) is carried untied, ``[B, H, N, 2D]``.

* ``model.model.rotary_emb`` -> :class:`TapeRotaryEmbedding`: the model's own rotary module (with the
  interpolated ``rope_parameters``) still computes cos/sin, and that table, repeated over heads, becomes the
  layer-0 state. It is called once per forward pass, before the layers, so it also starts the pass.
* every ``layer.self_attn`` -> :class:`TapeAttention`: the same q/k/v/o projections; q and k are rotated with
  the layer's state instead of the shared table, the state is appended to the values so one call of the
  model's attention function (``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``: ``sdpa``, ``eager``,
  ...) aggregates both, and the attention-side update ``state += s_h * (A state)`` follows.
* every ``layer.mlp`` -> :class:`TapeMLP`: the same SwiGLU; its output m feeds the MLP-side update
  ``state += dE(m, state)``.

The per-layer parameters are posbench's own ``TAPELayer`` (gate, x_proj, up_proj, down_proj) at
``model.layers.<i>.tape``; the gate and up_proj start at zero, so a converted model computes exactly what the
original computes. As in posbench's TAPE, the state after the last layer is discarded, so that layer neither
appends the state to its values nor updates it (its TAPE parameters exist and are frozen).

The state travels between layers through one :class:`TapeState` per model, indexed by layer, so that a
gradient-checkpointed layer recomputes from the same input state in the backward pass. A recomputation must
leave nothing behind in that object: PyTorch's recomputed graph holds its saved tensors strongly and stops as
soon as the last one is recomputed (inside the MLP-side update), so a state kept from it would keep that
layer's activations alive for the rest of the backward pass. Hence the MLP takes the attention's result out
of the object before computing anything, and a recomputation never replaces the next layer's input. The KV cache holds,
per layer, the rotated keys and the values widened by each past token's layer-input state (what a new
token's attention-side update aggregates), exactly as posbench's own TAPE caches it.

Grouped-query models (fewer key/value heads than query heads) are supported: keys and values are repeated to
one per query head before rotation, because TAPE's per-head state makes every head's keys different after
the first update. Their KV cache is then as large as a multi-head model's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import ALL_ATTENTION_FUNCTIONS, LlamaAttention, eager_attention_forward

from posbench.encodings.rope import training_offset
from posbench.encodings.tape import TAPELayer, rotate_by_state
from posbench.hf.cache_api import take_cache


class TapeState:
    """The state entering each layer (and after each layer's attention) for the current forward pass."""

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = n_layers, n_heads
        self.tied: bool | None = None               # the table's halves are equal (decided on the first pass)
        self.tape_layers: list[TAPELayer] = []
        self.inputs: list[Tensor | None] = [None] * n_layers
        self.mids: list[Tensor | None] = [None] * n_layers

    def start(self, cos: Tensor, sin: Tensor) -> None:
        """A new forward pass: the layer-0 state is the rotary table ``[B, N, D]`` (tied: ``[c | s]`` of its
        first halves) repeated over heads."""
        half = cos.shape[-1] // 2
        if self.tied is None:
            self.tied = bool(torch.equal(cos[..., :half], cos[..., half:]) and
                             torch.equal(sin[..., :half], sin[..., half:]))
        table = torch.cat((cos[..., :half], sin[..., :half]) if self.tied else (cos, sin), dim=-1).float()
        self.inputs = [table[:, None].expand(-1, self.n_heads, -1, -1)] + [None] * (self.n_layers - 1)
        self.mids = [None] * self.n_layers

    def release(self) -> None:
        """Drop the last pass's states (they are kept until the next pass, for a checkpointed backward)."""
        self.inputs = [None] * self.n_layers
        self.mids = [None] * self.n_layers

    def input(self, layer: int) -> Tensor:
        state = self.inputs[layer]
        if state is None:
            raise RuntimeError(f"TAPE state of layer {layer} is missing: the model's layers ran out of order")
        return state

    def is_last(self, layer: int) -> bool:
        return layer == self.n_layers - 1

    def tape(self, layer: int) -> TAPELayer:
        return self.tape_layers[layer]


class TapeRotaryEmbedding(nn.Module):
    """The model's rotary module, unchanged, plus: its float32 table starts TAPE's state for this pass.

    ``random_offset`` (the reference's TAPE, and posbench's, in training only): every position of a forward
    pass is shifted by one k ~ U{0..2 x max_positions} (posbench's ``training_offset``)."""

    def __init__(self, rotary: nn.Module, state: TapeState, random_offset: bool = False, max_positions: int = 0):
        super().__init__()
        self.inner = rotary
        self._state = state
        self.random_offset, self.max_positions = random_offset, max_positions

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        position_ids = training_offset(self, position_ids, self.random_offset, self.max_positions)
        cos, sin = self.inner(torch.empty(0, device=x.device, dtype=torch.float32), position_ids)
        self._state.start(cos, sin)
        return cos.to(x.dtype), sin.to(x.dtype)


def repeat_heads(x: Tensor, groups: int) -> Tensor:
    """``[B, KVH, N, D] -> [B, KVH * groups, N, D]`` (query head h uses key/value head h // groups)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class TapeAttention(LlamaAttention):
    """Llama attention with TAPE: the original projections, rotation by the per-head state, the state
    aggregated with the values in the same attention call, and the attention-side update. A ``LlamaAttention``
    to transformers, whose ``output_attentions=True`` collects the weights of that class's modules (a plain
    module's were left out: an empty tuple); built from the original's projections, not by its constructor."""

    #: implementations that take values wider than the keys in one call; others get head_dim-wide chunks
    ONE_PASS = ("eager", "sdpa")

    def __init__(self, attention: nn.Module, state: TapeState):
        nn.Module.__init__(self)                # (LlamaAttention's would make new projections)
        self.config = attention.config
        self.layer_idx = attention.layer_idx
        self.head_dim = attention.head_dim
        self.kv_groups = attention.num_key_value_groups
        self.num_key_value_groups = 1           # keys and values reach the attention function per query head
        self.scaling = attention.scaling
        self.attention_dropout = attention.attention_dropout
        self.is_causal = True
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj)
        self._state = state

    def forward(self, hidden_states: Tensor, position_embeddings=None, attention_mask: Tensor | None = None,
                **kwargs) -> tuple[Tensor, Tensor | None]:
        cache = take_cache(kwargs)          # ``cache`` from transformers 5.24, ``past_key_values`` before
        b, n, _ = hidden_states.shape
        shape = (b, n, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = repeat_heads(self.k_proj(hidden_states).view(shape).transpose(1, 2), self.kv_groups)
        v = repeat_heads(self.v_proj(hidden_states).view(shape).transpose(1, 2), self.kv_groups)
        state = self._state.input(self.layer_idx).expand(b, -1, -1, -1)  # [B, H, N, D] float32 (tied)
        q, k = rotate_by_state(q, state.to(q.dtype)), rotate_by_state(k, state.to(k.dtype))
        last = self._state.is_last(self.layer_idx)
        if not last:                                                     # aggregated by the same weights as v
            v = torch.cat((v, state.to(v.dtype)), dim=-1)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out, weights = self._attend(q, k, v, attention_mask, **kwargs)  # [B, N, H, Dv]; the eager weights
        if not last:
            aggregated = out[..., self.head_dim:].transpose(1, 2)        # [B, H, N, D] (tied)
            gate = self._state.tape(self.layer_idx).head_gate().to(aggregated.dtype)
            self._state.mids[self.layer_idx] = state + gate[None, :, None, None] * aggregated
        y = out[..., :self.head_dim].reshape(b, n, -1).contiguous()
        return self.o_proj(y), weights

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, attention_mask, **kwargs) -> tuple[Tensor, Tensor | None]:
        """The attention's output and its weights, as the implementation returns them (eager: ``[B, H, N, Nk]``,
        what ``output_attentions=True`` hands back, as Llama's; sdpa: None); in head_dim chunks of the values
        where the implementation takes no wider values (the weights, of the same q and k, are the first chunk's)."""
        implementation = self.config._attn_implementation
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        options = dict(dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
        if implementation in self.ONE_PASS:
            out, weights = attend(self, q, k, v, attention_mask, **options)[:2]
            return out, weights
        parts = [attend(self, q, k, part.contiguous(), attention_mask, **options)[:2]
                 for part in v.split(self.head_dim, dim=-1)]
        return torch.cat([out for out, _ in parts], dim=-1), parts[0][1]


class TapeMLP(nn.Module):
    """The Llama MLP, unchanged, whose output then drives TAPE's MLP-side state update."""

    def __init__(self, mlp: nn.Module, state: TapeState, layer_idx: int):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj, self.act_fn = mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn
        self.layer_idx = layer_idx
        self._state = state

    def forward(self, x: Tensor) -> Tensor:
        i, state = self.layer_idx, self._state
        mid, state.mids[i] = state.mids[i], None
        m = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        if mid is not None:
            update = mid + state.tape(i).mlp_update(m, mid.to(m.dtype))
            if state.inputs[i + 1] is None:
                state.inputs[i + 1] = update
            if not torch.is_grad_enabled():
                state.inputs[i] = None            # no backward pass will recompute this layer
        return m


def convert_to_tape(model, position_size: int = 0, gate: str = "rowsum", random_offset: bool = False) -> TapeState:
    """Add TAPE to a ``LlamaForCausalLM`` in place (the rotary module, every attention and MLP swapped, a
    ``TAPELayer`` per layer at ``model.layers.<i>.tape``); returns the shared state object.

    ``position_size`` I defaults to 4 x heads (the reference's 128 for Llama-2-7B). x_proj and down_proj
    start as N(0, initializer_range), the gate and up_proj at zero, so both updates are zero and the logits
    are the original's. The last layer's TAPE parameters never reach the loss and are frozen.
    ``random_offset``: shift training positions as the reference does (see ``TapeRotaryEmbedding``), by up to
    twice the model's ``max_position_embeddings`` (the extension length once the RoPE is set)."""
    config = model.config
    layers = model.model.layers
    heads = config.num_attention_heads
    position_size = position_size or 4 * heads
    state = TapeState(len(layers), heads)
    weight = model.model.embed_tokens.weight
    std = getattr(config, "initializer_range", 0.02)
    model.model.rotary_emb = TapeRotaryEmbedding(model.model.rotary_emb, state, random_offset,
                                                 config.max_position_embeddings)
    for i, layer in enumerate(layers):
        tape = TAPELayer(config.hidden_size, heads, position_size, gate).to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for name, param in tape.named_parameters():
                if name == "gate" or name.startswith("up_proj"):
                    param.zero_()
                else:
                    param.normal_(0.0, std)
        layer.tape = tape
        state.tape_layers.append(tape)
        layer.self_attn = TapeAttention(layer.self_attn, state)
        layer.mlp = TapeMLP(layer.mlp, state, i)
    for param in layers[-1].tape.parameters():
        param.requires_grad_(False)
    model.train(model.training)                   # the new modules take the model's mode (eval after loading)
    return state
