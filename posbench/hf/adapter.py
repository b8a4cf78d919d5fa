"""A Hugging Face causal LM behind posbench's model interface, so the engine and the tasks use it as they use
``posbench.model.Transformer``:

* ``model(tokens [B, N], positions=None, cache=None) -> logits [B, N, V]``;
* ``model.generate(prompt, max_new_tokens, eos_id=None, use_cache=True)``: posbench's greedy decoding with
  transformers' ``DynamicCache`` (``new_cache()``), so a TAPE model decodes with its widened cache;
* ``model.config.to_dict()`` and ``model.num_parameters()`` for the result;
* ``state_dict()`` / ``load_state_dict()`` hold only what training changes (the trainable parameters and the
  method's own tensors), so the engine's checkpoints of a 7B model are megabytes of LoRA or TAPE plus the
  embeddings, not 13 GB of frozen weights; the frozen weights are reloaded from the base model on resume.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys

from posbench.generate import greedy_generate
from posbench.hf.rope import llama_of


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

    def forward(self, tokens: Tensor, positions: Tensor | None = None, cache=None) -> Tensor:
        kwargs: dict[str, Any] = {}
        if positions is not None:
            positions = positions.to(tokens.device)
            kwargs["position_ids"] = positions.expand(tokens.shape[0], -1) if positions.dim() == 1 else positions
        out = self.hf(input_ids=tokens, past_key_values=cache, use_cache=cache is not None, **kwargs)
        return out.logits

    def new_cache(self, capacity: int = 0):
        """transformers' ``DynamicCache`` (it grows by concatenation; ``capacity``, posbench's preallocation
        hint, is not needed)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.llama.config)

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
                 use_cache: bool = True) -> Tensor:
        return greedy_generate(self, prompt, max_new_tokens, eos_id, use_cache)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.hf.parameters())

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
