"""The name transformers gives the KV cache, which changed in transformers 5.24.

Up to 5.23 a model's ``forward`` takes ``past_key_values`` and returns it under that name; from 5.24 both are
``cache`` and the old name is a deprecated alias (a FutureWarning, and ``generate`` hands the cache only under
the new name). posbench supports both: it calls transformers with the name the installed version uses, and its
own modules take the cache under either name.
"""

from __future__ import annotations

import inspect
from typing import Any

from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaModel

#: the keyword the installed transformers uses for the cache (``cache`` from 5.24, ``past_key_values`` before)
CACHE_ARG = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
#: the field of a model output that holds the cache
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """``{name: cache}`` under the installed transformers' name, for calling a transformers model."""
    return {CACHE_ARG: cache}


def take_cache(kwargs: dict[str, Any], given: Any = None) -> Any:
    """The cache a transformers caller passed to one of posbench's modules, under either name (removed from
    ``kwargs`` so that it is not handed on twice)."""
    for name in ("cache", "past_key_values"):
        found = kwargs.pop(name, None)
        if given is None:
            given = found
    return given


def causal_lm_output(**fields: Any) -> CausalLMOutputWithPast:
    """A ``CausalLMOutputWithPast``; ``cache=`` goes to the field the installed transformers reads."""
    if "cache" in fields:
        fields[CACHE_FIELD] = fields.pop("cache")
    return CausalLMOutputWithPast(**fields)
