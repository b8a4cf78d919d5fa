"""posbench's own model (``posbench.model.Transformer``, any encoding) as a Hugging Face causal LM.

``PosbenchConfig`` (``model_type = "posbench"``) holds a ``ModelConfig``'s fields under their own names (the
standard names ``hidden_size``, ``num_hidden_layers``, ... are aliases); ``PosbenchForCausalLM`` wraps the
``Transformer`` as ``self.model`` (weights ``model.<posbench name>``), so the logits are posbench's own, computed
by the same code that trained the model.

Importing this module registers both classes with ``AutoConfig`` and ``AutoModelForCausalLM``, so that
``AutoModelForCausalLM.from_pretrained(DIR)`` loads an export in a process that imported it; an export also
carries two small files for ``trust_remote_code=True`` (``posbench.hf.export``), which import this module.

Generation: ``GenerationMixin.generate`` with transformers' own ``DynamicCache``. The cache holds what posbench's
KV cache holds (rotated keys, values with TAPE's state appended); a thin view gives the ``Transformer`` the
interface of ``posbench.model.generate.KVCache`` over it, so a cached step runs exactly posbench's cached step.
``use_cache=False`` recomputes the whole sequence at every step. Padded batches (lm-eval's ``generate_until`` pads
on the left) go through posbench's own padding (``posbench.model.padding``): the ``attention_mask`` columns of
this call's tokens (the cache keeps those of the earlier ones) and transformers' ``position_ids``, so each row
decodes as it would alone, for every encoding.

``output_attentions=True`` (or the config's ``output_attentions``) returns the attention weights as Llama's eager
attention does, one ``[batch, heads, queries, keys]`` tensor per block (per block and pass for a looped model):
those of posbench's own scores, bias included (``posbench.model.attention.attention_weights``), zero on the keys
a query does not see; computed only when asked for, so the logits are the same either way.
``output_hidden_states=True`` returns what Llama's does: the input of every block (per block and pass for a looped
model), then the input of the output layer (after the final norm), so ``lm_head(hidden_states[-1])`` is the logits.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from transformers import (AutoConfig, AutoModelForCausalLM, DynamicCache, GenerationMixin, PreTrainedConfig,
                          PreTrainedModel)
from transformers import initialization as init
from transformers.modeling_outputs import CausalLMOutputWithPast

from posbench.hf.cache_api import causal_lm_output, take_cache
from posbench.model.generate import shared_rows
from posbench.model import ModelConfig, Transformer
from posbench.model.config import BACKBONE
from posbench.model.padding import CachePadding, extended
from posbench.model.transformer import RMSNorm

MODEL_TYPE = "posbench"
#: the ModelConfig fields a PosbenchConfig carries
MODEL_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len", "encoding",
                "encoding_options", "attention", "norm_eps", "init_std", *BACKBONE)


class PosbenchConfig(PreTrainedConfig):
    model_type = MODEL_TYPE
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                     "num_key_value_heads": "n_heads", "intermediate_size": "d_ff",
                     "max_position_embeddings": "max_seq_len", "rms_norm_eps": "norm_eps",
                     "initializer_range": "init_std"}

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 0
    max_seq_len: int = 256
    encoding: str = "rope"
    encoding_options: dict | None = None
    attention: str = "auto"
    norm_eps: float = 1e-5
    init_std: float = 0.02
    norm: str = "rms"
    norm_position: str = "pre"
    mlp: str = "swiglu"
    embedding_norm: bool = False
    head_mlp: bool = False
    recurrences: int = 1
    eval_recurrences: int = 0
    input_injection: bool = False
    state_std: float = 0.0
    init_scheme: str = "normal"
    tie_word_embeddings: bool = False
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs):
        if self.d_ff <= 0:
            self.d_ff = 4 * self.d_model
        self.encoding_options = dict(self.encoding_options or {})
        super().__post_init__(**kwargs)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def model_config(self) -> ModelConfig:
        """The posbench ``ModelConfig`` this configuration describes."""
        return ModelConfig(**{name: getattr(self, name) for name in MODEL_FIELDS})

    @classmethod
    def from_model_config(cls, config: ModelConfig | dict[str, Any], **kwargs) -> PosbenchConfig:
        values = config.to_dict() if isinstance(config, ModelConfig) else dict(config)
        return cls(**{name: values[name] for name in MODEL_FIELDS if name in values}, **kwargs)


class PosbenchForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = PosbenchConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    def __init__(self, config: PosbenchConfig):
        super().__init__(config)
        self.model = Transformer(config.model_config())
        config.encoding_options = dict(self.model.config.encoding_options)     # every resolved option
        if next(self.model.parameters()).device.type != "meta":
            # posbench initialised every tensor (encodings have their own inits): post_init must not redo it
            for param in self.model.parameters():
                param._is_hf_initialized = True
        self._reference: dict[str, nn.Module] = {}     # a plain dict: never a submodule, never saved
        self.post_init()

    # ---- what transformers asks of a causal LM -------------------------------------------------------
    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> nn.Module:
        return self.model.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.model.lm_head = value

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, inputs_embeds: Tensor | None = None,
                labels: Tensor | None = None, use_cache: bool | None = None, logits_to_keep: int = 0,
                **kwargs: Any) -> CausalLMOutputWithPast:
        cache = take_cache(kwargs)          # ``cache`` from transformers 5.24, ``past_key_values`` before
        if input_ids is None or inputs_embeds is not None:
            raise ValueError("a posbench model takes input_ids (not inputs_embeds)")
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError("a posbench model takes a 2-D attention_mask [batch, tokens] (1: a token, 0: a pad)")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        # a looped model (posbench's recurrences) keeps one cache layer per block and pass, more than the config's
        # num_hidden_layers, which a cache made from the config (here, or by generate) holds
        layers, need = getattr(cache, "layers", None), self.model.config.n_layers * self.model.config.depth
        if isinstance(layers, list) and layers and len(layers) < need:
            layers.extend(type(layers[-1])() for _ in range(need - len(layers)))
        view = CacheView(cache, self.model.config.n_layers * self.model.config.depth) if cache is not None else None
        if attention_mask is not None:              # its last columns are this call's tokens; a cache has the rest
            attention_mask = attention_mask[:, -input_ids.shape[1]:]
        output_attentions = asked(self.config, kwargs, "output_attentions")
        output_hidden_states = asked(self.config, kwargs, "output_hidden_states")
        with attention_weights(self.model, output_attentions) as attentions, \
                block_inputs(self.model, output_hidden_states) as hidden_states:
            logits = self.model(input_ids, positions=position_ids, cache=view, attention_mask=attention_mask)
        if view is not None:
            view.store_positions()
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(),
                                               ignore_index=-100)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return causal_lm_output(loss=loss, logits=logits, cache=cache if use_cache else None,
                                attentions=tuple(attentions) if output_attentions else None,
                                hidden_states=tuple(hidden_states) if output_hidden_states else None)

    # ---- initialisation (from_pretrained builds on the meta device) ----------------------------------
    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Missing weights get posbench's generic init (``init`` skips the loaded ones); an encoding's
        non-persistent buffers (ALiBi's slopes, FIRE's L, T5's buckets), which no checkpoint holds, are copied
        from a freshly built encoding with the same options."""
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            init.ones_(module.weight)
        self._restore_buffers(module)

    def _restore_buffers(self, module: nn.Module) -> None:
        own = getattr(module, "_non_persistent_buffers_set", set())
        if not own:
            return
        path = {id(m): name for name, m in self.model.encoding.named_modules()}.get(id(module))
        if path is None:
            return
        fresh = self._reference_encoding().get_submodule(path)
        for name in own:
            buffer = getattr(module, name)
            if buffer is not None:
                init.copy_(buffer, getattr(fresh, name).to(buffer.dtype))

    def _reference_encoding(self) -> nn.Module:
        if "encoding" not in self._reference:
            enc, cfg = self.model.encoding, self.model.config
            with torch.device("cpu"):
                self._reference["encoding"] = type(enc)(cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.d_model,
                                                        cfg.max_seq_len, **cfg.encoding_options)
        return self._reference["encoding"]


def asked(config: PosbenchConfig, kwargs: dict[str, Any], name: str) -> bool:
    """Whether the call asks for an output (``output_attentions``): its argument, else the config's switch."""
    given = kwargs.pop(name, None)
    return bool(getattr(config, name, False)) if given is None else given


@contextmanager
def attention_weights(model: Transformer, wanted: bool):
    """A list that, while the block runs, receives the attention weights of every attention call of ``model``
    (``Attention.weights``) when ``wanted``: ``[B, H, Nq, Nk]`` each, one per block (per block and pass for a
    looped model), as Llama returns them for ``output_attentions=True``; nothing is computed otherwise."""
    found: list[Tensor] = []
    if not wanted:
        yield found
        return
    layers = [block.attn for block in model.blocks]
    for attention in layers:
        attention.weights = found
    try:
        yield found
    finally:
        for attention in layers:
            attention.weights = None


@contextmanager
def block_inputs(model: Transformer, wanted: bool):
    """A list that, while the block runs, receives the input of every block call of ``model`` and then the output
    layer's (``[B, N, d_model]`` each) when ``wanted``: a Llama's ``hidden_states``; nothing is kept otherwise."""
    found: list[Tensor] = []
    if not wanted:
        yield found
        return
    hooks = [module.register_forward_pre_hook(lambda module, args: found.append(args[0]))
             for module in (*model.blocks, model.lm_head)]
    try:
        yield found
    finally:
        for hook in hooks:
            hook.remove()


class CacheView:
    """posbench's KV-cache interface (``length``, ``layers[i].append(k, v, positions)``, ``memory``, ``padding``)
    over a transformers ``Cache``: keys and values go to ``cache.update``; the key positions (for
    position-dependent biases), the encoding's memory (Abacus: each row's digit run) and a padded batch's key mask
    are kept on the cache object next to them."""

    ATTRIBUTE = "_posbench_key_positions"
    MEMORY = "_posbench_encoding_memory"      # the encoding's dict between calls (posbench's KVCache.memory)
    PADDING = "_posbench_padding"             # which cached keys are real (posbench's KVCache.padding)

    def __init__(self, cache, n_layers: int):
        self.cache = cache
        self.length = int(cache.get_seq_length())
        self.layers = [LayerView(self, i) for i in range(n_layers)]
        self._keys: Tensor | None = None
        if self.length == 0 or getattr(cache, self.MEMORY, None) is None:
            setattr(cache, self.MEMORY, {})
            setattr(cache, self.PADDING, None)
        self.memory: dict[str, Tensor] = getattr(cache, self.MEMORY)

    @property
    def padding(self) -> CachePadding | None:
        return getattr(self.cache, self.PADDING, None)

    def pad(self, mask: Tensor | None, n: int, trailing: bool) -> Tensor | None:
        """As ``posbench.model.generate.KVCache.pad``: the key mask of this call (None while nothing is padded)."""
        padding = extended(self.padding, self.length, mask, n, trailing)
        setattr(self.cache, self.PADDING, padding)
        return padding.key_mask if padding is not None else None

    def key_positions(self, positions: Tensor, total: int) -> Tensor:
        """Positions of every cached key ``[B or 1, total]``: the earlier ones, then ``positions``."""
        if self._keys is None:
            new = positions[:1] if shared_rows(positions) else positions
            old = getattr(self.cache, self.ATTRIBUTE, None)
            if old is None or self.length == 0:
                keys = new
            else:
                old = old[:, :self.length]
                rows = max(old.shape[0], new.shape[0])
                keys = torch.cat((old.expand(rows, -1), new.expand(rows, -1)), dim=1)
            self._keys = keys
        return self._keys[:, :total]

    def store_positions(self) -> None:
        if self._keys is not None:
            setattr(self.cache, self.ATTRIBUTE, self._keys)


class LayerView:
    def __init__(self, view: CacheView, index: int):
        self.view, self.index = view, index

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        keys, values = self.view.cache.update(k, v, self.index)
        return keys, values, self.view.key_positions(positions, keys.shape[2])


def register() -> None:
    """Register the classes with transformers' Auto classes (idempotent)."""
    AutoConfig.register(MODEL_TYPE, PosbenchConfig, exist_ok=True)
    AutoModelForCausalLM.register(PosbenchConfig, PosbenchForCausalLM, exist_ok=True)


register()
