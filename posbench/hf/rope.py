"""The rotary-embedding changes of context extension, all written as transformers' own ``rope_parameters``.

* linear position interpolation (Chen et al. 2023; the TAPE authors give every method factor 2 for
  4096 -> 8192): position t is rotated as t / scale; ``theta`` also raises the RoPE base (1e6 in the paper's
  "Theta Scaling"). ``tape``, ``lora``, ``longlora``, ``theta``.
* YaRN (Peng et al. 2023), ``rope_type="yarn"``: with L the original context, s = ``--scale``, D the head size
  and b the base, dimension pair d (frequency theta_d = b^(-2d/D), wavelength 2 pi / theta_d) completes
  r_d = L theta_d / (2 pi) turns over L; pairs with r_d > beta_fast (32) keep theta_d, pairs with r_d < beta_slow
  (1) get theta_d / s, and in between a linear ramp over the pair index mixes the two (the paper's reference code
  and transformers ramp over the index, between floor and ceil of the pairs where r = beta_fast and
  r = beta_slow; the paper's text writes the ramp in r). cos and sin are multiplied by 0.1 ln(s) + 1, so every
  attention logit by its square: the paper's temperature sqrt(1/t) = 0.1 ln(s) + 1. Static: one table.
* dynamic NTK-aware scaling (bloc97 / emozilla 2023; "Dynamic NTK" in the YaRN paper), ``rope_type="dynamic"``:
  at a sequence of length l > L the base becomes b' = b (s l / L - (s - 1))^(D / (D - 2)) and every pair rotates
  at b'^(-2d/D); at l <= L the table is RoPE's own. With s = 1 this is the YaRN paper's Dynamic NTK
  (scale l / L); a larger s scales harder. transformers measures l from the position ids of each forward pass
  and takes L = ``max_position_embeddings``, so for ``dynamic`` :func:`set_rope` keeps the original context
  there and writes the extended length as ``n_positions`` (what lm-evaluation-harness reads first). The base
  depends on the sequence, so a KV cache written at one length and read at another mixes
  tables (transformers' behaviour; recomputing without a cache does not).

Each is written into the model's ``config.rope_parameters`` (the transformers v5 field) and the model's rotary
module is rebuilt from it, so a saved model reloads with the same table in any transformers tool.
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


def _plain_rope(config, method: str, scale: float) -> dict[str, Any]:
    """The model's RoPE parameters, which must be plain RoPE; ``scale`` must be >= 1."""
    params = dict(config.rope_parameters)
    kind = params.get("rope_type", "default")
    if scale < 1:
        raise HFModelError(f"--scale must be >= 1, got {scale:g}")
    if kind != "default":
        raise HFModelError(f"{method} scales plain RoPE; this model uses rope_type '{kind}'")
    return params


def yarn_rope_parameters(config, scale: float, *, beta_fast: float = 32.0, beta_slow: float = 1.0,
                         attention_factor: float | None = None) -> dict[str, Any]:
    """``rope_parameters`` for YaRN by ``scale`` from the model's context (``max_position_embeddings``);
    ``attention_factor`` None: YaRN's 0.1 ln(scale) + 1."""
    params = _plain_rope(config, "yarn", scale)
    out = {"rope_type": "yarn", "rope_theta": float(params.get("rope_theta", 10000.0)), "factor": float(scale),
           "original_max_position_embeddings": int(config.max_position_embeddings),
           "beta_fast": float(beta_fast), "beta_slow": float(beta_slow)}
    if attention_factor is not None:
        out["attention_factor"] = float(attention_factor)
    return out


def dynamic_ntk_rope_parameters(config, scale: float) -> dict[str, Any]:
    """``rope_parameters`` for dynamic NTK-aware scaling with factor ``scale``."""
    params = _plain_rope(config, "ntk", scale)
    return {"rope_type": "dynamic", "rope_theta": float(params.get("rope_theta", 10000.0)), "factor": float(scale)}


def set_rope(model, rope_parameters: dict[str, Any], max_positions: int) -> None:
    """Write the RoPE parameters and the new context length into ``model.config`` and rebuild its rotary table."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # transformers: a Llama given

    base = llama_of(model)
    config = base.config
    config.rope_parameters = dict(rope_parameters)
    set_context(config, max_positions)
    device = base.model.embed_tokens.weight.device
    base.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)


def set_context(config, length: int) -> None:
    """The context length the model was extended to, where tools read it: ``max_position_embeddings``; but
    ``rope_type="dynamic"`` keeps the original there (transformers scales from it, and the context has no fixed
    end), so the length goes to ``n_positions``, which lm-evaluation-harness reads first."""
    if config.rope_parameters.get("rope_type") == "dynamic":
        config.n_positions = int(length)
    else:
        config.max_position_embeddings = int(length)


def llama_of(model):
    """The ``LlamaForCausalLM`` inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model
