"""Claims tables as data (``posbench.report.claims``): the one rule on readings worked out by hand (a verdict is no
wider than its intervals: "agrees" needs every comparison the claim makes to exclude zero on its side), a claims
file's mistakes refused in one line, a comparison's interval equal to ``compare --against``'s for the same rows, and
every published page's claims block equal to what its claims file computes from the committed runs."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from posbench import report
from posbench.report.claims import Claim, ClaimsError, Measurer, Outcome, Pair, Side, load, refresh, verdict
from posbench.stats import Difference

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies"))
#: every page with a claims file: (the claims file, the page)
PAGES = [(ROOT / "docs/studies/protocols/claims.toml", ROOT / "docs/studies/protocols.md"),
         (ROOT / "docs/studies/arithmetic/8k/claims.toml", ROOT / "docs/studies/arithmetic.md"),
         (ROOT / "docs/studies/arithmetic/4k/claims.toml", ROOT / "docs/studies/arithmetic/4k.md"),
         (ROOT / "docs/studies/cpu/v2/claims.toml", ROOT / "docs/studies/cpu.md"),
         (ROOT / "docs/studies/cpu/v1/claims.toml", ROOT / "docs/studies/cpu/v1.md")]


def outcome(low, high):
    side = Side(Path("."), "x")
    return Outcome(Pair(side, side), Difference((low + high) / 2, low, high, 0.5, 2, 3, None), None)


def claim(expect="order", comparable=True):
    return Claim("c", "c", "s", "n", "r", "p", "accuracy", [], expect, comparable, "why")


@pytest.mark.parametrize("intervals, expect, want", [
    ([(1, 3), (0.5, 2)], "order", "agrees"),
    ([(1, 3), (-2, 54)], "order", "mixed"),            # above one row, no different from another: not "agrees"
    ([(-13, 62), (-2, 54)], "order", "no difference"),
    ([(-3, -1), (-5, -2)], "order", "disagrees"),
    ([(1, 3), (-5, -2)], "order", "mixed"),
    ([(-1, 1), (-0.2, 0.3)], "alike", "no difference"),
    ([(-1, 1), (0.1, 0.3)], "alike", "disagrees"),
])
def test_the_rule(intervals, expect, want):
    assert verdict(claim(expect), [outcome(*i) for i in intervals]) == want


def test_a_claim_under_another_protocol_is_not_comparable_whatever_its_numbers():
    assert verdict(claim(comparable=False), [outcome(1, 3)]) == "not comparable"


@pytest.mark.parametrize("text, words", [
    ('[[claim]]\nid = "a"\n', "missing"),
    ('[[claim]]\nid="a"\nclaim="c"\nsource="s"\nnumber="n"\nrelease="r"\nprotocol="p"\nmetric="m"\n', "every comparison"),
    ('[[claim]]\nid="a"\nclaim="c"\nsource="s"\nnumber="n"\nrelease="r"\nprotocol="p"\nmetric="m"\ncomparable=false\n',
     "says why"),
    ('[[claim]]\nid="a"\nclaim="c"\nsource="s"\nnumber="n"\nrelease="r"\nprotocol="p"\nmetric="m"\nexpect="most"\n'
     'comparisons=[{above={encoding="a"}, below={encoding="b"}}]\n', "expect"),
    ("[[claim\n", "claims.toml"),
])
def test_a_claims_files_mistakes_are_one_line(tmp_path, text, words):
    path = tmp_path / "claims.toml"
    path.write_text(text)
    with pytest.raises(ClaimsError) as info:
        load(path)
    assert words in str(info.value) and "\n" not in str(info.value)


def alibi_above_rope(name: str, claim: str, metric: str, runs: Path) -> str:
    """A claims file's claim that ALiBi's runs in ``runs`` are above RoPE's in ``metric``."""
    return f"""
[[claim]]
id = "{name}"
claim = "{claim}"
source = "s"
number = "n"
release = "r"
protocol = "p"
metric = "{metric}"
comparisons = [{{above = {{runs = "{runs}", encoding = "alibi"}}, below = {{runs = "{runs}", encoding = "rope"}}}}]
"""


def test_a_comparison_is_compares_paired_difference(tmp_path):
    """On the tiny study fixture (2 encodings x 2 seeds): ALiBi above RoPE in ppl_4x and in passkey accuracy, the
    same estimate and interval as ``compare --against rope`` gives."""
    fixture = ROOT / "tests/fixtures/study/runs"
    path = tmp_path / "claims.toml"
    path.write_text(alibi_above_rope("alibi", "ALiBi extrapolates better than RoPE", "ppl_4x", fixture) +
                    alibi_above_rope("passkey", "ALiBi retrieves better than RoPE", "accuracy", fixture))
    measurer = Measurer()
    tables = report.collect(fixture, against="rope").tables
    for item in load(path):
        (got,) = measurer.measure(item)
        task = "perplexity" if item.metric == "ppl_4x" else "passkey"
        table = next(t for t in tables if t.task == task and t.kind == "metrics")
        (want,) = [d.difference for d in table.differences if d.metric == item.metric]
        sign = -1 if task == "perplexity" else 1           # lower perplexity is better: above's advantage
        assert got.difference.estimate == pytest.approx(sign * want.estimate)
        assert sorted([got.difference.low, got.difference.high]) == \
            pytest.approx(sorted([sign * want.low, sign * want.high]))


def test_a_side_without_runs_is_one_line(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text('[[claim]]\nid="a"\nclaim="c"\nsource="s"\nnumber="n"\nrelease="r"\nprotocol="p"\nmetric="ppl_4x"\n'
                    f'comparisons=[{{above={{runs="{ROOT / "tests/fixtures/study/runs"}", encoding="nope"}}, '
                    f'below={{runs="{ROOT / "tests/fixtures/study/runs"}", encoding="rope"}}}}]\n')
    with pytest.raises(ClaimsError) as info:
        Measurer().measure(load(path)[0])
    assert "no run of nope" in str(info.value)


@pytest.fixture(scope="module")
def measurer():
    """One reading for every page: a folder two pages use (the 8,000-step study's runs, the CPU study's) is read,
    and its examples resampled, once."""
    return Measurer()


@pytest.mark.slow  # every comparison of every published claims table, measured over the committed runs
@pytest.mark.parametrize("claims, page", PAGES, ids=lambda p: p.parent.name)
def test_every_published_claims_table_is_its_data_under_the_rule(claims, page, measurer):
    text = page.read_text()
    assert refresh(text, claims, measurer) == text, f"{page}: its claims block is not what {claims} computes"


@pytest.mark.parametrize("setting, value, refused", [("model.n_layers", 3, True), ("train.threads", 2, False)])
def test_a_side_matching_runs_of_one_seed_that_differ_is_refused(tmp_path, setting, value, refused):
    """Two runs of one seed under one side: a rerun of the same settings (or one differing only in a setting that
    changes no result, train.threads) keeps the newer, as compare does; runs that differ in a setting that counts
    are refused in one line naming it, not silently replaced by the newer (a group added to a study later once
    took the place of the claim's runs that way)."""
    runs = tmp_path / "runs"
    shutil.copytree(ROOT / "tests/fixtures/study/runs", runs)
    source = runs / "perplexity-alibi-tiny-s0"
    twin = runs / "perplexity-alibi-tiny-s0-twin"
    shutil.copytree(source, twin)
    record = json.loads((twin / "result.json").read_text())
    section, key = setting.split(".")
    record["config"][section][key] = value
    if section == "model":                          # the model as built is what a run's settings read
        record["config"]["model_config"][key] = value
    record["finished"] = "2099-01-01T00:00:00+00:00"
    record["run_id"] += "-twin"
    (twin / "result.json").write_text(json.dumps(record))
    path = tmp_path / "claims.toml"
    path.write_text(alibi_above_rope("alibi", "ALiBi extrapolates better than RoPE", "ppl_4x", runs))
    if refused:
        with pytest.raises(ClaimsError) as info:
            Measurer().measure(load(path)[0])
        assert "differ in model.n_layers" in str(info.value) and "\n" not in str(info.value)
    else:
        (outcome,) = Measurer().measure(load(path)[0])
        assert outcome.difference.estimate is not None
