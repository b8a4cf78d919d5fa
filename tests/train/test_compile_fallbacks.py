"""A run says when torch.compile fell back to eager (issue 35): past dynamo's recompile limit a compiled function
runs unfused for later shapes with one logged warning; posbench prints one line and records the functions in
``environment.compile_fallbacks`` of result.json."""

from __future__ import annotations

import json

import pytest
import torch

from posbench.cli import main
from posbench.train.compile_watch import EagerFallbacks


def double(x):
    return x * 2


def test_a_hit_recompile_limit_is_caught():
    torch._dynamo.reset()
    compiled = torch.compile(double, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2), EagerFallbacks() as watch:
        for n in range(1, 6):                       # five shapes, two graphs allowed
            assert torch.equal(compiled(torch.ones(n)), torch.full((n,), 2.0))
    torch._dynamo.reset()
    assert len(watch.found) == 1 and watch.found[0].startswith("double (") and "recompile_limit" in watch.found[0]
    assert watch.note().startswith("note: torch.compile hit its recompile limit")
    with EagerFallbacks() as quiet:
        torch.ones(3) * 2
    assert quiet.found == [] and quiet.note() is None


@pytest.mark.slow  # a whole run
def test_a_run_that_fell_back_says_so_once_and_records_it(tmp_path, monkeypatch, capsys):
    from posbench.tasks.perplexity.task import Perplexity

    torch._dynamo.reset()
    compiled = torch.compile(double, backend="eager", dynamic=False)
    evaluate = Perplexity.evaluate

    def evaluate_with_many_shapes(self, model, device, reporter, phases):
        for n in range(1, 6):
            compiled(torch.ones(n))
        return evaluate(self, model, device, reporter, phases)

    monkeypatch.setattr(Perplexity, "evaluate", evaluate_with_many_shapes)
    try:
        with torch._dynamo.config.patch(recompile_limit=2):
            assert main(["run", "-e", "rope", "-t", "perplexity", "-p", "tiny", "--quiet", "--out", str(tmp_path)]) == 0
    finally:
        torch._dynamo.reset()
    err = capsys.readouterr().err
    assert err.count("note: torch.compile hit its recompile limit") == 1
    record = json.loads(next(tmp_path.rglob("result.json")).read_text())
    assert record["environment"]["compile_fallbacks"][0].startswith("double (")
