"""A posbench RoPE model is a Llama: the configuration and the weight names, both ways.

posbench's ``Transformer`` with ``encoding="rope"`` has Llama's architecture exactly: pre-norm blocks with
RMSNorm (``x * rsqrt(mean(x^2) + eps) * w``, eps = ``norm_eps``), attention without biases scaled by
1/sqrt(head_dim), rotary embedding in the half-split layout (``rotate_half``) with base ``theta`` and positions
divided by ``scale`` (Llama's ``linear`` rope type), a SwiGLU MLP ``down(silu(gate(x)) * up(x))`` and untied
input / output embeddings. Only the tensor names differ, and the fused ``qkv`` projection: its output rows
are ``[q | k | v]``, each ``[head 0 | head 1 | ...]`` of ``head_dim`` rows, which is Llama's layout of
``q_proj``, ``k_proj`` and ``v_proj`` stacked.

The RoPE option ``random_offset`` acts only while training (a random shift per forward pass); an evaluated
model has none, so it does not enter the Llama. posbench computes the rotary angles in float64 and Llama in
float32, so the logits agree to float32 rounding, not bitwise.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import LlamaConfig

from posbench.errors import UserError

#: posbench name -> Llama name, per layer ({i}) and global
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.out.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                "lm_head.weight": "lm_head.weight"}
QKV = ("q_proj", "k_proj", "v_proj")


class LlamaExportError(UserError):
    """A model that is not a Llama, or weights that do not fit one; ``str()`` is one line."""


def rope_parameters(options: dict[str, Any]) -> dict[str, Any]:
    """posbench's RoPE options as Llama's ``rope_parameters``."""
    theta, scale = float(options.get("theta", 10000.0)), float(options.get("scale", 1.0))
    if scale == 1.0:
        return {"rope_type": "default", "rope_theta": theta}
    return {"rope_type": "linear", "factor": scale, "rope_theta": theta}


def llama_config(model_config: dict[str, Any], *, bos_id: int | None, eos_id: int | None, pad_id: int | None):
    """The ``LlamaConfig`` of a posbench RoPE ``ModelConfig`` (as a dict)."""
    if model_config.get("encoding") != "rope":
        raise LlamaExportError(f"only a RoPE model is a Llama; this one uses {model_config.get('encoding')!r}")
    d, heads = int(model_config["d_model"]), int(model_config["n_heads"])
    return LlamaConfig(vocab_size=int(model_config["vocab_size"]), hidden_size=d,
                       intermediate_size=int(model_config["d_ff"]) or 4 * d,
                       num_hidden_layers=int(model_config["n_layers"]), num_attention_heads=heads,
                       num_key_value_heads=heads, head_dim=d // heads, hidden_act="silu",
                       max_position_embeddings=int(model_config["max_seq_len"]),
                       initializer_range=float(model_config.get("init_std", 0.02)),
                       rms_norm_eps=float(model_config.get("norm_eps", 1e-5)),
                       rope_parameters=rope_parameters(model_config.get("encoding_options") or {}),
                       attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
                       bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)


def model_config_from_llama(config, extra_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The posbench ``ModelConfig`` (a dict) of a ``LlamaConfig`` that posbench's RoPE model can hold;
    ``extra_options``: RoPE options no Llama records (``random_offset``)."""
    rope = dict(config.rope_parameters or {})
    kind = rope.get("rope_type", "default")
    heads, d = int(config.num_attention_heads), int(config.hidden_size)
    problems = []
    if kind not in ("default", "linear"):
        problems.append(f"rope_type '{kind}'")
    if int(config.num_key_value_heads or heads) != heads:
        problems.append("grouped-query attention")
    if (getattr(config, "head_dim", None) or d // heads) * heads != d:
        problems.append("head_dim x heads != hidden_size")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        problems.append("biases")
    if getattr(config, "tie_word_embeddings", False):
        problems.append("tied embeddings")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"activation {config.hidden_act}")
    if problems:
        raise LlamaExportError(f"this Llama is not a posbench RoPE model ({', '.join(problems)})")
    options = {"theta": float(rope.get("rope_theta", 10000.0)),
               "scale": float(rope.get("factor", 1.0)) if kind == "linear" else 1.0,
               "random_offset": False, **(extra_options or {})}
    return {"vocab_size": int(config.vocab_size), "d_model": d, "n_layers": int(config.num_hidden_layers),
            "n_heads": heads, "d_ff": int(config.intermediate_size), "max_seq_len": int(config.max_position_embeddings),
            "encoding": "rope", "encoding_options": options, "norm_eps": float(config.rms_norm_eps),
            "init_std": float(getattr(config, "initializer_range", 0.02))}


def to_llama(state: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """posbench RoPE weights -> ``LlamaForCausalLM`` weights (every tensor used exactly once)."""
    out: dict[str, Tensor] = {}
    left = dict(state)
    for ours, theirs in GLOBAL_NAMES.items():
        out[theirs] = _take(left, ours)
    for i in range(n_layers):
        for ours, theirs in LAYER_NAMES.items():
            out[f"model.layers.{i}.{theirs}"] = _take(left, f"blocks.{i}.{ours}")
        q, k, v = _take(left, f"blocks.{i}.attn.qkv.weight").chunk(3, dim=0)
        for name, weight in zip(QKV, (q, k, v)):
            out[f"model.layers.{i}.self_attn.{name}.weight"] = weight.contiguous()
    if left:
        raise LlamaExportError(f"tensors with no place in a Llama: {', '.join(sorted(left)[:5])}")
    return out


def from_llama(state: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """``LlamaForCausalLM`` weights -> posbench RoPE weights (the inverse of :func:`to_llama`)."""
    out: dict[str, Tensor] = {}
    left = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    for ours, theirs in GLOBAL_NAMES.items():
        out[ours] = _take(left, theirs)
    for i in range(n_layers):
        for ours, theirs in LAYER_NAMES.items():
            out[f"blocks.{i}.{ours}"] = _take(left, f"model.layers.{i}.{theirs}")
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            [_take(left, f"model.layers.{i}.self_attn.{name}.weight") for name in QKV], dim=0)
    if left:
        raise LlamaExportError(f"Llama tensors posbench has no place for: {', '.join(sorted(left)[:5])}")
    return out


def _take(tensors: dict[str, Tensor], name: str) -> Tensor:
    try:
        return tensors.pop(name)
    except KeyError:
        raise LlamaExportError(f"missing tensor {name}") from None
