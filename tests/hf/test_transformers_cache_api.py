"""posbench under both names transformers has given the KV cache (``past_key_values`` up to 5.23, ``cache`` from
5.24), and no deprecation warning from transformers on posbench's own calls.

transformers 5.24 renamed the argument and the output field; its ``generate`` hands the cache only under the new
name, so a module that read the old one started every cached step from an empty cache and generated wrong tokens.
Each test here runs a cached path with transformers' deprecation warnings turned into errors (pyproject's
``filterwarnings`` does the same for the whole suite), and checks cached decoding against recomputation: token ids
must be identical.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from encoding_helpers import one_thread, perturb_tape  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def deprecations_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        yield


def test_take_cache_reads_either_name_and_removes_it():
    from posbench.hf.cache_api import take_cache

    marker = object()
    for name in ("cache", "past_key_values"):
        kwargs = {name: marker, "other": 1}
        assert take_cache(kwargs) is marker and kwargs == {"other": 1}
    assert take_cache({}) is None


def test_the_cache_name_is_the_installed_transformers_own():
    import inspect

    from transformers import LlamaForCausalLM

    from posbench.hf.cache_api import CACHE_ARG, causal_lm_output

    assert CACHE_ARG in inspect.signature(LlamaForCausalLM.forward).parameters
    marker = object()
    out = causal_lm_output(logits=torch.zeros(1), cache=marker)
    assert getattr(out, CACHE_ARG) is marker


def _tiny_llama(seed=0):
    from transformers import LlamaForCausalLM

    from posbench.hf.tiny import tiny_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(61, layers=2, attention="eager", initializer_range=0.2)).eval()


def test_a_llama_behind_posbench_decodes_with_its_cache_as_by_recomputation():
    from posbench.hf.adapter import HFCausalLM, HFModelConfig

    adapter = HFCausalLM(_tiny_llama(), HFModelConfig(label="llama", method=None)).eval()
    prompt = torch.randint(3, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    assert torch.equal(adapter.generate(prompt, 10, use_cache=True), adapter.generate(prompt, 10, use_cache=False))


def test_a_tape_llama_generates_with_transformers_cache_as_by_recomputation():
    """TAPE's attention reads the cache transformers hands it (under either name): ``generate`` with the cache
    equals ``generate`` without."""
    from posbench.hf.tape_llama import convert_to_tape

    model = _tiny_llama()
    convert_to_tape(model)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.model.layers:
            for p in layer.tape.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    prompt = torch.randint(3, 61, (2, 6), generator=torch.Generator().manual_seed(3))
    cached = model.generate(prompt, max_new_tokens=10, do_sample=False, min_new_tokens=10)
    full = model.generate(prompt, max_new_tokens=10, do_sample=False, min_new_tokens=10, use_cache=False)
    assert torch.equal(cached, full)


@pytest.mark.parametrize("encoding", ["tape", "alibi", "abacus"])
def test_posbench_models_generate_through_transformers_with_the_cache(encoding):
    """``PosbenchForCausalLM.generate`` (transformers' loop and its DynamicCache) equals posbench's own greedy
    decoding; the cache transformers passes back is the one posbench filled (a cache dropped between steps would
    recompute from nothing and give other tokens)."""
    from posbench.hf.modeling import PosbenchConfig, PosbenchForCausalLM
    from posbench.model import ModelConfig

    options = {"digit_ids": list(range(48, 58))} if encoding == "abacus" else {}
    torch.manual_seed(0)
    config = PosbenchConfig.from_model_config(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4,
                                                          encoding=encoding, encoding_options=options, init_std=0.2))
    hf = PosbenchForCausalLM(config).eval()
    if encoding == "tape":
        perturb_tape(hf.model)
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(4))
    cached = hf.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    full = hf.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12, use_cache=False)
    assert torch.equal(cached, full)
    assert torch.equal(cached[:, 5:], hf.model.generate(prompt, 12))
