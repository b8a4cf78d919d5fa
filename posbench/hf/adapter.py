"""A Hugging Face causal LM behind posbench's model interface, so the engine and the tasks use it as they use
``posbench.model.Transformer``:

* ``model(tokens [B, N], positions=None, cache=None, attention_mask=None) -> logits [B, N, V]``; a padded batch's
  mask is kept on the cache (transformers' models take the mask of every key at each call), and the positions
  count each row's real tokens, as transformers' ``generate`` counts them;
* ``model.generate(prompt, max_new_tokens, eos_id=None, use_cache=True, attention_mask=None)``: posbench's greedy
  decoding with transformers' ``DynamicCache`` (``new_cache()``), so a TAPE model decodes with its widened cache;
* ``model.config.to_dict()`` and ``model.num_parameters()`` for the result;
* ``state_dict()`` / ``load_state_dict()`` hold only what training changes (the trainable parameters and the
  method's own tensors), so the engine's checkpoints of a 7B model are megabytes of LoRA or TAPE plus the
  embeddings, not 13 GB of frozen weights; the frozen weights are reloaded from the base model on resume.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys
from transformers import DynamicCache

from posbench.errors import ConfigError
from posbench.hf.loading import default_dtype, describe, load_llama
from posbench.hf.methods import apply_method
from posbench.hf.saving import load_extended, weights_digest
from posbench.model.generate import greedy_generate
from posbench.hf.cache_api import cache_kwargs
from posbench.hf.rope import llama_of
from posbench.train.device import pick_device


@dataclass
class HFModelConfig:
    """What a result records as the model's configuration (``result["config"]["model_config"]``)."""

    label: str
    method: str | None
    method_options: dict[str, Any] = field(default_factory=dict)
    base_model: str | None = None
    model_dir: str | None = None
    scale: float | None = None
    length: int | None = None
    llama: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "hf", "label": self.label, "encoding": self.label, "method": self.method,
                "method_options": dict(self.method_options), "base_model": self.base_model,
                "model_dir": self.model_dir, "scale": self.scale, "length": self.length, "llama": dict(self.llama)}


class HFCausalLM(nn.Module):
    def __init__(self, model: nn.Module, config: HFModelConfig, method=None):
        super().__init__()
        self.hf = model
        self.config = config
        self.method = method

    @property
    def llama(self):
        return llama_of(self.hf)

    #: where a padded batch's attention mask is kept on a transformers cache, for the next call
    MASK = "_posbench_attention_mask"

    def forward(self, tokens: Tensor, positions: Tensor | None = None, cache=None,
                attention_mask: Tensor | None = None) -> Tensor:
        kwargs: dict[str, Any] = {}
        mask = self.every_key_mask(tokens, cache, attention_mask)
        if mask is not None:
            kwargs["attention_mask"] = mask
            if positions is None:                  # each row's real tokens counted (a pad's position: 0)
                positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -tokens.shape[1]:]
        if positions is not None:
            positions = positions.to(tokens.device)
            kwargs["position_ids"] = positions.expand(tokens.shape[0], -1) if positions.dim() == 1 else positions
        out = self.hf(input_ids=tokens, use_cache=cache is not None, **cache_kwargs(cache), **kwargs)
        return out.logits

    def every_key_mask(self, tokens: Tensor, cache, attention_mask: Tensor | None) -> Tensor | None:
        """The mask of every key this call sees ``[B, cached + N]`` (the cache's earlier mask, then this call's or
        ones), kept on the cache; None while no call was padded."""
        length = int(cache.get_seq_length()) if cache is not None else 0
        earlier = getattr(cache, self.MASK, None) if length else None
        if attention_mask is None and earlier is None:
            return None
        new = attention_mask.to(tokens.device) if attention_mask is not None else torch.ones_like(tokens)
        if earlier is None and length:
            earlier = torch.ones(tokens.shape[0], length, dtype=new.dtype, device=tokens.device)
        mask = new if earlier is None else torch.cat((earlier, new.to(earlier.dtype)), dim=1)
        if cache is not None:
            setattr(cache, self.MASK, mask)
        return mask

    def new_cache(self, capacity: int = 0):
        """transformers' ``DynamicCache`` (it grows by concatenation; ``capacity``, posbench's preallocation
        hint, is not needed)."""
        return DynamicCache(config=self.llama.config)

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
                 use_cache: bool = True, attention_mask: Tensor | None = None) -> Tensor:
        return greedy_generate(self, prompt, max_new_tokens, eos_id, use_cache, attention_mask)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.hf.parameters())

    @property
    def device(self) -> torch.device:
        return next(self.hf.parameters()).device

    def enable_checkpointing(self) -> None:
        enable_checkpointing(self.hf)

    def use_attention(self, name: str) -> None:
        self.llama.set_attn_implementation(name)

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.hf.parameters() if p.requires_grad)

    # ---- checkpoints: only what training changes -------------------------------------------------------
    def checkpoint_names(self) -> set[str]:
        trainable = {name for name, p in self.hf.named_parameters() if p.requires_grad}
        own = {name for name in self.hf.state_dict() if self.method is not None
               and self.method.is_method_parameter(name)}
        return trainable | own

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        full = self.hf.state_dict(keep_vars=keep_vars)
        out = destination if destination is not None else OrderedDict()
        for name in sorted(self.checkpoint_names()):
            out[prefix + name] = full[name]
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        names = self.checkpoint_names()
        missing = sorted(names - set(state_dict))
        unexpected = sorted(set(state_dict) - names)
        if strict and (missing or unexpected):
            raise RuntimeError(f"checkpoint does not fit: {len(missing)} tensors missing, {len(unexpected)} unexpected")
        self.hf.load_state_dict({k: v for k, v in state_dict.items() if k in names}, strict=False, assign=assign)
        return _IncompatibleKeys(missing, unexpected)


def enable_checkpointing(model) -> None:
    """Gradient checkpointing of every decoder layer (non-reentrant: TAPE's state reaches the next layer
    outside the layer's return value, which only non-reentrant checkpointing differentiates through)."""
    llama = llama_of(model)
    enable = getattr(llama, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        llama.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


# ---- building one -------------------------------------------------------------------------------------------

ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "eager": "eager"}


def load_pretrained(source: Any, config: Any, vocab_size: int) -> tuple[HFCausalLM, dict[str, Any]]:
    """A pretrained (or extended) model named by ``--init`` for a task to evaluate or train, and the ``init``
    record of the result. Trainable parts (the method's, embeddings, norms) require gradients only when the run
    trains (``train.steps`` > 0)."""
    attention = config.model.get("attention", "auto")
    if attention not in ATTENTION:
        raise ConfigError(f"model.attention={attention!r}: a Hugging Face model runs with {', '.join(ATTENTION)}")
    device = pick_device(config.device)
    model, method, meta = load_extended(source.model_dir, dtype=default_dtype(device), device="cpu",
                                        attention=ATTENTION[attention], trainable=config.training.steps > 0)
    if vocab_size > model.config.vocab_size:
        raise ConfigError(f"--init {source.given}: the tokenizer has {vocab_size} tokens, the model's vocabulary "
                          f"only {model.config.vocab_size}")
    meta = meta or {}
    hf_config = HFModelConfig(label=config.label, method=method.name if method else None,
                              method_options=method.resolved_options(llama_of(model).config) if method else {},
                              base_model=meta.get("base_model", str(source.model_dir)), model_dir=str(source.model_dir),
                              scale=meta.get("scale"), length=meta.get("length", model.config.max_position_embeddings),
                              llama=describe(model.config))
    local = Path(str(source.model_dir)).is_dir()
    record = {"run": source.given, "kind": source.kind, "label": source.label, "method": hf_config.method,
              "base_model": hf_config.base_model, "model_dir": str(source.model_dir),
              "checkpoint_sha256": weights_digest(Path(source.model_dir)) if local else None}
    return HFCausalLM(model, hf_config, method), record


def extended_model(model_dir: str, method: Any, scale: float, length: int, label: str, device: torch.device
                   ) -> HFCausalLM:
    """The pretrained Llama in ``model_dir`` with ``method`` applied for ``length`` tokens: RoPE interpolated by
    ``scale`` (and theta set), the method's modules added, what trains marked; the attention it trains with
    (LongLoRA's shifted sparse attention) selected."""
    model = load_llama(model_dir, dtype=default_dtype(device), device="cpu")
    base_parameters = sum(p.numel() for p in model.parameters())
    model = apply_method(model, method, scale, length)
    llama = llama_of(model)
    attention = method.training_attention()
    if attention is not None:
        llama.set_attn_implementation(attention)
    hf_config = HFModelConfig(label=label, method=method.name, method_options=method.resolved_options(llama.config),
                              base_model=str(model_dir), scale=scale, length=length, llama=describe(llama.config))
    adapter = HFCausalLM(model, hf_config, method)
    adapter.base_parameters = base_parameters
    return adapter
