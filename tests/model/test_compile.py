"""``torch.compile``: every encoding's model is one graph for all its layers (no recompilation per layer, no
graph break), FlexAttention included.

Graph counts use dynamo's ``CompileCounter`` backend: it counts the graphs dynamo hands to a backend and runs
them as traced, without generating code. No test here runs Inductor's CPU code generation: posbench never
compiles for a CPU in use, and Inductor's CPU FlexAttention returns wrong values at random at lengths that are
not a multiple of its block size on some CPUs (pytorch/pytorch#159247). What compiled FlexAttention computes
on a GPU is tested in ``test_gpu.py``; the padding that keeps it off those lengths, in ``test_backends.py``.
Tolerance 1e-5 relative to the largest entry (float32).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounter


from encoding_helpers import fresh_dynamo, one_thread  # noqa: F401 (fixtures)
from encoding_helpers import BUILTIN, assert_close, seeded, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_dynamo")

#: one encoding of each way an encoding enters attention, the four the GPU call's CPU rehearsal benches: rotated
#: queries and keys (RoPE), an element-wise bias (ALiBi), a bias from q and k (CoPE), TAPE's tensor state. The fast
#: tier compiles these; the slow one every other built-in encoding too.
FAMILY = ("rope", "alibi", "cope", "tape")


def by_family(encodings) -> list:
    return [pytest.param(e, marks=() if e in FAMILY else pytest.mark.slow) for e in encodings]


@pytest.mark.parametrize("encoding", by_family(BUILTIN))
def test_a_compiled_model_is_one_graph_for_all_layers(encoding):
    model = tiny(encoding, layers=4, d_model=64, heads=4).train()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)   # fullgraph: a graph break fails
    for step in range(3):                                             # training steps: the first compiles
        compiled(tokens(2, 12, seed=step)).logsumexp(-1).mean().backward()
    assert counter.frame_count == 1, "one graph for the whole training forward, all four layers in it"
    model.eval()
    with torch.no_grad():
        compiled(tokens(2, 12))
        compiled(tokens(2, 12, seed=5))
    assert counter.frame_count == 2, "evaluation mode is the one other graph"


def test_compiled_tape_trains_like_eager():
    """AOT autograd traces TAPE's forward and backward as one graph each; the step equals eager (the same
    random offset: both draw it from torch's generator)."""
    eager = tiny("tape", layers=3)
    twin = tiny("tape", layers=3)
    twin.load_state_dict(eager.state_dict())
    counter = CompileCounter()

    def backend(gm, example_inputs):
        counter(gm, example_inputs)
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def keep(graph, _):
            return make_boxed_func(graph)
        return aot_autograd(fw_compiler=keep, bw_compiler=keep)(gm, example_inputs)

    compiled = torch.compile(twin, backend=backend, fullgraph=True)
    x = tokens(2, 12)
    for model in (eager, compiled):
        seeded(model, x, seed=4).logsumexp(-1).mean().backward()
    assert counter.frame_count == 1
    for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
        if p.grad is None:
            assert q.grad is None, name
        else:
            assert_close(q.grad, p.grad, rel=1e-4, msg=name)


@pytest.mark.parametrize("encoding", by_family(["alibi", "t5", "fire", "kerple", "sandwich"]))
def test_a_compiled_model_traces_flex_attention_in_its_one_graph(encoding):
    """What a compiled model does on a GPU with a bias: the causal block mask and the encoding's score_mod are
    traced inside the model's single graph (no graph break). Run here in inference, where FlexAttention works
    on a CPU; the captured graph computes what eager attention computes (1e-5)."""
    reference = tiny(encoding, layers=3, d_model=64, heads=4, attention="eager").eval()
    model = tiny(encoding, layers=3, d_model=64, heads=4, attention="flex").eval()
    model.load_state_dict(reference.state_dict())
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close(compiled(tokens(2, 20)), reference(tokens(2, 20)))
    assert counter.frame_count == 1
