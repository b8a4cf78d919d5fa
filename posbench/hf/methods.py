"""The context-extension methods of ``posbench extend`` (the TAPE paper's section 3.5 recipe), one class each.

The paper's four methods first interpolate RoPE positions linearly by ``--scale`` (``posbench.hf.rope``), then:

* ``tape``: TAPE inside the Llama (``posbench.hf.tape_llama``); trainable: TAPE's per-layer modules (both
  the attention-side gate and the MLP-side update: the reference code's typo freezes the gate, here it
  trains), the embeddings and the norms. As in the reference, training positions get one random offset
  k ~ U{0..2 x length} per forward pass (``method.random_offset``; the LoRA baselines get none).
* ``lora``: LoRA (``peft``; r 8, alpha 16, dropout 0) on q, k, v, o; trainable: LoRA, embeddings, norms.
* ``longlora``: the same LoRA, trained with shifted sparse attention (``posbench.hf.s2attn``); full
  attention at evaluation.
* ``theta``: the same LoRA with RoPE theta raised to 1e6 on top of the interpolation ("Theta Scaling").

Two more change the rotary embedding in another way (``--scale`` is their factor):

* ``yarn``: YaRN (Peng et al. 2023) instead of the linear interpolation, by factor ``--scale``: RoPE
  frequencies interpolated by parts (beta_fast 32, beta_slow 1) and the attention temperature
  ``sqrt(1/t) = 0.1 ln(scale) + 1``, as transformers' ``rope_type="yarn"`` computes them; trained as ``lora``
  (the same trainable set, so that only the rotary embedding differs; the YaRN paper fine-tunes every weight).
* ``ntk``: dynamic NTK-aware scaling (transformers' ``rope_type="dynamic"``, ``factor`` = ``--scale``) instead
  of the interpolation, with no training at all: nothing is trainable and the run takes 0 steps (its
  configuration starts from 0; a ``--steps`` above 0 is refused, :meth:`Method.check_steps`). The RoPE base
  grows with the sequence length (``posbench.hf.rope``).

"Embeddings and norms" follows LongLoRA's ``trainable_params="embed,norm"``: ``model.embed_tokens``, every
RMSNorm, not ``lm_head``. A method's options are ``--set method.KEY=VALUE``. Each method states its
trainable-parameter count as a formula of the architecture (:meth:`Method.trainable_formula`); the tests
check it against the model. Every option is declared once in ``OPTIONS`` (default, help, range) and checked when
the method is made, as every encoding's and task's.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file
from torch import nn

from posbench.errors import ConfigError
from posbench.options import Bound, Configurable, Option, at_least, positive
from posbench.encodings.tape import TAPE as TapeEncoding
from posbench.hf.loading import HFModelError, head_dim, load_llama, load_tape_llama, read_config_json, tape_model
from posbench.hf.rope import (dynamic_ntk_rope_parameters, llama_of, scaled_rope_parameters, set_rope,
                              yarn_rope_parameters)
from posbench.hf.s2attn import group_size, register
from posbench.registry import Registry

METHODS: Registry = Registry("method")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class Method(Configurable):
    """Base class: subclass it with a ``name`` and its ``OPTIONS``; defining the class registers it."""

    kind: ClassVar[str] = "method"
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: False for a training-free method (its runs take 0 steps; ``--steps`` above 0 is refused)
    trains: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        METHODS.add_subclass(cls)

    def __init__(self, **options: Any):
        self.options = self.resolve(options)

    def resolved_options(self, config) -> dict[str, Any]:
        """The options as the model built from ``config`` uses them (a 0 that means "derived" replaced by the
        derived value); what a result records as the model's."""
        return dict(self.options)

    # ---- the conversion -------------------------------------------------------------------------------
    def rope_parameters(self, config, scale: float) -> dict[str, Any]:
        return scaled_rope_parameters(config, scale)

    def convert(self, model) -> nn.Module:
        """Add the method's modules to a ``LlamaForCausalLM`` (rope already set); returns the model to train."""
        raise NotImplementedError

    def training_attention(self) -> str | None:
        """The attention implementation used while training (None: the model's own)."""
        return None

    def check_length(self, length: int) -> None:
        """Refuse a training length the method cannot train on (one-line error)."""

    def check_steps(self, steps: int) -> None:
        """Refuse training steps a training-free method cannot take (one-line error)."""
        if not self.trains and steps > 0:
            raise ConfigError(f"method '{self.name}' trains nothing ({self.description}): leave --steps out "
                              f"(it takes 0 steps; it is still evaluated at --length and saved)")

    def is_method_parameter(self, name: str) -> bool:
        raise NotImplementedError

    def mark_trainable(self, model) -> None:
        """Freeze everything but the method's parameters, the embeddings and the norms (float32 when the base
        model is in a half type, so that the optimizer's small updates are not rounded away)."""
        frozen = self.frozen_names(model)
        for name, param in model.named_parameters():
            trainable = (self.is_method_parameter(name) or is_embedding_or_norm(name)) and name not in frozen
            param.requires_grad_(trainable)
            if trainable and param.dtype in (torch.float16, torch.bfloat16):
                param.data = param.data.float()

    def frozen_names(self, model) -> set[str]:
        return set()

    # ---- save / load ----------------------------------------------------------------------------------
    def save(self, model, directory: Path) -> list[str]:
        """Write the method's own tensors next to the saved Llama; returns the files written."""
        raise NotImplementedError

    def load(self, model, directory: Path) -> nn.Module:
        """Convert a reloaded Llama and load the method's tensors; returns the model."""
        raise NotImplementedError

    def load_model(self, directory: Path, **how: Any) -> nn.Module:
        """The saved model in ``directory`` (``how``: dtype, device, attention, as ``load_llama`` takes them):
        the Llama with the method's tensors loaded."""
        return self.load(load_llama(directory, **how), Path(directory))

    def base_state_dict(self, model) -> dict[str, torch.Tensor]:
        """The Llama's own tensors under their original names (without the method's)."""
        raise NotImplementedError

    def merged(self, model) -> nn.Module | None:
        """The model as a plain ``LlamaForCausalLM`` computing the same function with an adapter folded into the
        weights, or None when there is nothing to fold (the model is saved as the method saves it: TAPE's own
        model type, ntk's Llama whose rope_parameters are the whole method)."""
        return None

    # ---- counts ---------------------------------------------------------------------------------------
    def added_formula(self, config) -> int:
        """Parameters the method adds to the Llama."""
        raise NotImplementedError

    def trainable_formula(self, config) -> int:
        """Trainable parameters, from the architecture alone."""
        return self.method_trainable_formula(config) + embedding_and_norm_count(config)

    def method_trainable_formula(self, config) -> int:
        return self.added_formula(config)


def is_embedding_or_norm(name: str) -> bool:
    leaf = name.split(".")
    return any(part == "embed_tokens" or part.endswith("norm") for part in leaf)


def embedding_and_norm_count(config) -> int:
    """V x d (token embeddings) + (2L + 1) x d (two RMSNorms per layer and the final one)."""
    return config.vocab_size * config.hidden_size + (2 * config.num_hidden_layers + 1) * config.hidden_size


# ---- TAPE --------------------------------------------------------------------------------------------------

class TapeMethod(Method):
    name = "tape"
    description = "TAPE in every layer (zero-initialised updates, both trained), plus embeddings and norms"
    #: TAPE's own options, declared once by the encoding (posbench.encodings.tape); in a Llama the training
    #: length is the ``--length`` the model is extended to
    OPTIONS = {key: TapeEncoding.OPTIONS[key] for key in ("position_size", "gate", "random_offset")}

    def convert(self, model):
        from posbench.hf.tape_llama import convert_to_tape  # transformers: only a TAPE Llama needs it

        convert_to_tape(model, self.options["position_size"], self.options["gate"], self.options["random_offset"])
        return model

    def is_method_parameter(self, name: str) -> bool:
        return ".tape." in f".{name}"

    def frozen_names(self, model) -> set[str]:
        last = len(model.model.layers) - 1          # the state after the last layer is discarded
        return {n for n, _ in model.named_parameters() if n.startswith(f"model.layers.{last}.tape.")}

    def position_size(self, config) -> int:
        return self.options["position_size"] or 4 * config.num_attention_heads

    def resolved_options(self, config) -> dict[str, Any]:
        return {**self.options, "position_size": self.position_size(config)}

    def added_formula(self, config) -> int:
        """L x (d x I + 2 x H x I + H x H) (row-sum gate; H for the scalar gate): the reference's formula."""
        d, h, i = config.hidden_size, config.num_attention_heads, self.position_size(config)
        gate = h * h if self.options["gate"] == "rowsum" else h
        return config.num_hidden_layers * (d * i + 2 * h * i + gate)

    def method_trainable_formula(self, config) -> int:
        """All but the last layer's TAPE parameters (they never reach the loss)."""
        return self.added_formula(config) * (config.num_hidden_layers - 1) // config.num_hidden_layers

    def base_state_dict(self, model):
        """Every tensor, the TAPE ones with the Llama's: saved as one model (``posbench.hf.tape_model``)."""
        return dict(model.state_dict())

    def save(self, model, directory: Path) -> list[str]:
        """The saved state becomes a ``TapeLlamaForCausalLM``: config.json of its type (which transformers loads
        only with posbench's code, never as a plain Llama without TAPE) and its remote-code files."""
        config = llama_of(model).config
        return tape_model().write_tape_files(config, self.resolved_options(config), directory)

    def load_model(self, directory: Path, **how: Any):
        if (read_config_json(Path(directory)) or {}).get("model_type") == tape_model().MODEL_TYPE:
            return load_tape_llama(directory, **how)
        return super().load_model(directory, **how)          # saved before the TAPE model type: tape.safetensors

    def load(self, model, directory: Path):
        model = self.convert(model)
        path = directory / TAPE_FILE
        try:
            tensors = load_file(str(path))
        except Exception as exc:  # noqa: BLE001
            raise HFModelError(f"cannot read TAPE weights {path} ({type(exc).__name__})") from None
        expected = {k for k in model.state_dict() if self.is_method_parameter(k)}
        if set(tensors) != expected:
            raise HFModelError(f"{path} does not fit this model ({len(expected - set(tensors))} TAPE tensors "
                               f"missing, {len(set(tensors) - expected)} unexpected)")
        model.load_state_dict(tensors, strict=False)
        return model


TAPE_FILE = "tape.safetensors"          # how TAPE's tensors were saved before the TAPE model type


# ---- LoRA and its variants ---------------------------------------------------------------------------------

class LoraMethod(Method):
    name = "lora"
    description = "LoRA r 8, alpha 16 on q, k, v, o (peft), plus embeddings and norms; full attention"
    OPTIONS = {
        "r": Option(8, "the LoRA rank", at_least(1)),
        "alpha": Option(16, "LoRA's alpha (the update is scaled by alpha / r)", positive()),
        "dropout": Option(0.0, "LoRA's dropout", Bound(0, 1, high_strict=True)),
    }
    ADAPTER_DIR = "adapter"

    def lora_config(self):
        return peft_library().LoraConfig(r=self.options["r"], lora_alpha=self.options["alpha"],
                                         lora_dropout=self.options["dropout"], target_modules=list(LORA_TARGETS),
                                         bias="none", task_type="CAUSAL_LM")

    def convert(self, model):
        with quiet_deprecations():
            return peft_library().get_peft_model(model, self.lora_config())

    def is_method_parameter(self, name: str) -> bool:
        return ".lora_" in name

    def added_formula(self, config) -> int:
        """r x (in + out) per adapted matrix: q (d -> H*D), k and v (d -> KVH*D), o (H*D -> d), every layer."""
        d, dh, r = config.hidden_size, head_dim(config), self.options["r"]
        q_out, kv_out = config.num_attention_heads * dh, config.num_key_value_heads * dh
        per_layer = r * (d + q_out) + 2 * r * (d + kv_out) + r * (q_out + d)
        return config.num_hidden_layers * per_layer

    def base_state_dict(self, model):
        llama = llama_of(model)
        return {k.replace(".base_layer.", "."): v for k, v in llama.state_dict().items() if ".lora_" not in k}

    def merged(self, model):
        """W + (alpha / r) B A in every adapted projection (peft's ``merge_and_unload``), on a copy."""
        with quiet_deprecations():
            return copy.deepcopy(model).merge_and_unload()

    def save(self, model, directory: Path) -> list[str]:
        model.save_pretrained(str(directory / self.ADAPTER_DIR))
        return [self.ADAPTER_DIR]

    def load(self, model, directory: Path):
        try:
            with quiet_deprecations():
                return peft_library().PeftModel.from_pretrained(model, str(directory / self.ADAPTER_DIR),
                                                                is_trainable=True)
        except Exception as exc:  # noqa: BLE001
            raise HFModelError(f"cannot load the LoRA adapter in {directory / self.ADAPTER_DIR} "
                               f"({type(exc).__name__})") from None


class LongLoraMethod(LoraMethod):
    name = "longlora"
    description = "LoRA as 'lora', trained with shifted sparse attention (S²-Attn, groups of 1/4); full attention at eval"
    OPTIONS = {**LoraMethod.OPTIONS,
               "group_ratio": Option(0.25, "S²-Attn's group size as a share of the training length",
                                     Bound(0, 1, low_strict=True))}

    def convert(self, model):
        register()
        for layer in model.model.layers:
            layer.self_attn.s2_group_ratio = self.options["group_ratio"]
        return super().convert(model)

    def training_attention(self) -> str | None:
        return register()

    def check_length(self, length: int) -> None:
        group_size(length, self.options["group_ratio"])


class ThetaMethod(LoraMethod):
    name = "theta"
    description = "RoPE theta 1e6 on top of the interpolation, plus LoRA as 'lora'"
    OPTIONS = {**LoraMethod.OPTIONS,
               "theta": Option(1e6, "the RoPE theta set on top of the interpolation",
                               Bound(low=1, low_strict=True))}

    def rope_parameters(self, config, scale: float) -> dict[str, Any]:
        return scaled_rope_parameters(config, scale, theta=self.options["theta"])


class YarnMethod(LoraMethod):
    name = "yarn"
    description = "YaRN by --scale (interpolation by parts, attention temperature), plus LoRA as 'lora'"
    OPTIONS = {**LoraMethod.OPTIONS,
               "beta_fast": Option(32.0, "YaRN's beta_fast (> beta_slow)", positive()),
               "beta_slow": Option(1.0, "YaRN's beta_slow", positive()),
               "attention_factor": Option(0.0, "the attention temperature (0: YaRN's own, 0.1 ln(scale) + 1, as "
                                               "transformers)", at_least(0))}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        if options["beta_fast"] <= options["beta_slow"]:
            raise ConfigError(f"method.beta_fast ({options['beta_fast']:g}) must exceed method.beta_slow "
                              f"({options['beta_slow']:g})")

    def rope_parameters(self, config, scale: float) -> dict[str, Any]:
        return yarn_rope_parameters(config, scale, beta_fast=self.options["beta_fast"],
                                    beta_slow=self.options["beta_slow"],
                                    attention_factor=self.options["attention_factor"] or None)


class NtkMethod(Method):
    name = "ntk"
    description = "dynamic NTK-aware RoPE scaling by --scale, training-free"
    trains = False

    def rope_parameters(self, config, scale: float) -> dict[str, Any]:
        return dynamic_ntk_rope_parameters(config, scale)

    def convert(self, model):
        return model                               # the rotary table (set_rope) is the whole method

    def is_method_parameter(self, name: str) -> bool:
        return False

    def mark_trainable(self, model) -> None:
        for param in model.parameters():
            param.requires_grad_(False)

    def added_formula(self, config) -> int:
        return 0

    def trainable_formula(self, config) -> int:
        return 0

    def base_state_dict(self, model):
        return dict(model.state_dict())

    def save(self, model, directory: Path) -> list[str]:
        return []                                  # config.json's rope_parameters hold everything

    def load(self, model, directory: Path):
        return model


@contextmanager
def quiet_deprecations():
    """peft calls transformers APIs that transformers 5 deprecates; the warning is theirs, not the user's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def peft_library():
    """``peft``, imported when a LoRA method first needs it."""
    import peft  # peft: heavy (it imports transformers), only the LoRA methods need it

    return peft


def make_method(name: str, options: dict[str, Any] | None = None) -> Method:
    return METHODS.get(name)(**(options or {}))


def apply_method(model, method: Method, scale: float, length: int):
    """Interpolate RoPE by ``scale`` (and set theta) for ``length`` tokens, add the method's modules, and mark what
    trains; returns the model to train."""
    set_rope(model, method.rope_parameters(model.config, scale), length)
    model = method.convert(model)
    method.mark_trainable(model)
    return model
