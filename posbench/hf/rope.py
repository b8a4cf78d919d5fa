"""The rotary-embedding changes of context extension: linear position interpolation and a new RoPE theta.

Every method of ``posbench extend`` interpolates positions linearly by ``--scale`` (Chen et al. 2023; the
TAPE authors give every method factor 2 for 4096 -> 8192): position t is rotated as t / scale. ``theta``
also raises the RoPE base (1e6 in the paper's "Theta Scaling"). Both are written into the model's own
``config.rope_parameters`` (the transformers v5 field) and the model's rotary module is rebuilt from it, so a
saved model reloads with the same table in any transformers tool.
"""

from __future__ import annotations

from typing import Any

from posbench.hf.loading import HFModelError


def scaled_rope_parameters(config, scale: float, theta: float | None = None) -> dict[str, Any]:
    """``config.rope_parameters`` with positions divided by ``scale`` (and the base set to ``theta``).

    A model with plain RoPE gets ``rope_type='linear'`` with ``factor=scale``; one that already interpolates
    linearly gets its factor multiplied. Other RoPE types (llama3, yarn, ...) rescale frequencies in their
    own way and are refused unless ``scale`` is 1."""
    params = dict(config.rope_parameters)
    kind = params.get("rope_type", "default")
    if scale < 1:
        raise HFModelError(f"--scale must be >= 1 (positions are divided by it), got {scale:g}")
    if scale != 1:
        if kind == "default":
            params.update(rope_type="linear", factor=float(scale))
        elif kind == "linear":
            params["factor"] = float(params["factor"]) * float(scale)
        else:
            raise HFModelError(f"--scale interpolates plain or linear RoPE; this model uses rope_type '{kind}' "
                               f"(pass --scale 1)")
    if theta is not None:
        params["rope_theta"] = float(theta)
    return params


def set_rope(model, rope_parameters: dict[str, Any], max_positions: int) -> None:
    """Write the RoPE parameters and the new context length into ``model.config`` and rebuild its rotary table."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    base = llama_of(model)
    config = base.config
    config.rope_parameters = dict(rope_parameters)
    config.max_position_embeddings = int(max_positions)
    device = base.model.embed_tokens.weight.device
    base.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)


def llama_of(model):
    """The ``LlamaForCausalLM`` inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model
