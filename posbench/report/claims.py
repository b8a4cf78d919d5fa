"""A study's claims table as data, its verdicts computed by one rule from the paired intervals.

A claims file (``claims.toml`` beside a study's runs) holds, per claim: what it says (``claim``), where
(``source``) and the paper's number (``number``), what the public release ran (``release``: the public commits'
launch scripts and code paths, with their files and lines), what posbench ran (``protocol``), whether the two
protocols are comparable (``comparable``; ``why`` when not), how the claim reads (``expect``: ``"order"``, each
comparison's ``above`` row is better than its ``below`` row; ``"alike"``, the rows do not differ), and
**every** comparison the claim makes (a claim "X is the best of five" makes four: X above each other row)::

    [[claim]]
    id = "fire-above-rope"
    claim = "FIRE above RoPE"
    source = "Zhu et al. 2025, Table 2"
    number = "FIRE 26.98, RoPE 26.32"
    release = "FIRE with init_L = 512 (zhuconv/arithmetic 84c16ad, shells/addition_ff.sh line 9)"
    protocol = "the depth-recurrent class, 3 seeds"
    metric = "accuracy"
    comparisons = [{above = {encoding = "fire", where = {"model.recurrences" = 16}},
                    below = {encoding = "rope", where = {"model.recurrences" = 16}}}]

A side names the runs of one row (those that record the claim's metric): their folder (``runs``, relative to the claims file; default ``runs``), the
encoding, and settings that must hold (``where``: ``section.key`` as ``posbench.results.frame`` names them, the
values the built model used). The two sides are paired by seed; the difference is "above minus below" in the
metric's better direction (positive: the claim's way), with compare's 95% interval (``posbench.stats.
paired_difference``: over seeds, and over the examples where both rows' runs have per-example results; a
``posbench compare --against``'s interval, so the two agree). A pair of runs of different machines or code is said
so (``posbench.report.paired.sittings``), and the table marks the comparison.

**The rule** (``verdict``): a comparison *supports* the claim when its interval lies above zero, *contradicts* it
when it lies below, and finds *no difference* when it holds zero. An ordering claim *agrees* only when every one of
its comparisons supports it; *disagrees* when every one contradicts it; *no difference* when none excludes zero;
*mixed* otherwise. An "alike" claim finds *no difference* when every interval holds zero (which is not a proof of
sameness: the interval says how large a difference it leaves room for) and *disagrees* when one excludes zero.
A claim whose protocols differ is *not comparable*, whatever the numbers.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.cells import cell, flat
from posbench.errors import UserError
from posbench.evaluation.metrics import METRICS
from posbench.report.comparison import Comparison
from posbench.report.paired import example_functions, sittings, value_of
from posbench.runs.record import RunRecord
from posbench.runs.store import scan_runs
from posbench.setting_facts import SettingFacts, declared_facts
from posbench.stats import Difference, StratifiedBootstrap, paired_difference

CLAIMS_FILE = "claims.toml"
EXPECT = ("order", "alike")
#: the table's column for ``release``; a claims file may name it otherwise (``release_header = "..."`` at its top)
RELEASE_HEADER = "what the public release ran"
RULE = ("verdicts by one rule (posbench.report.claims): a comparison supports the claim when its 95% interval lies "
        "on the claim's side of zero; a claim agrees only when every comparison it makes supports it, disagrees when "
        "every one contradicts it, finds no difference when none excludes zero, and is mixed otherwise; an 'alike' "
        "claim finds no difference when every interval holds zero; a claim run under another protocol than the "
        "paper's is not comparable")


class ClaimsError(UserError):
    """A claims file that cannot be read or whose rows cannot be found; one line."""


@dataclass(frozen=True)
class Side:
    runs: Path
    encoding: str
    where: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self.where.items())
        return self.encoding + (f" [{settings}]" if settings else "")


@dataclass(frozen=True)
class Pair:
    above: Side
    below: Side
    label: str = ""


@dataclass
class Claim:
    id: str
    claim: str
    source: str
    number: str
    release: str
    protocol: str
    metric: str
    comparisons: list[Pair]
    expect: str = "order"
    comparable: bool = True
    why: str = ""
    note: str = ""


@dataclass
class Outcome:
    pair: Pair
    difference: Difference
    across: str | None                  # "across machines", "across commits", ...

    @property
    def reading(self) -> str:
        d = self.difference
        if d.low is None or d.high is None:
            return "no interval"
        return "supports" if d.low > 0 else "contradicts" if d.high < 0 else "no difference"

    def reads(self, expect: str) -> str:
        """The reading as the table says it: an "alike" claim's comparisons either differ or do not."""
        return "differs" if expect == "alike" and self.reading in ("supports", "contradicts") else self.reading


def parsed(path: Path | str) -> dict[str, Any]:
    """A claims file's TOML (one line for a file that cannot be read)."""
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ClaimsError(f"{path}: {exc}") from None


def load(path: Path | str) -> list[Claim]:
    """The claims of a claims file, each checked for what the rule needs (one line for what is wrong)."""
    return claims_in(parsed(path), Path(path))


def claims_in(data: dict[str, Any], path: Path) -> list[Claim]:
    """The claims of a claims file's ``data`` (read from ``path``: sides' folders are relative to it)."""
    claims = []
    for entry in data.get("claim") or []:
        where = f"{path} claim {entry.get('id', '?')!r}"
        missing = [k for k in ("id", "claim", "source", "number", "release", "protocol", "metric") if k not in entry]
        if missing:
            raise ClaimsError(f"{where}: missing {', '.join(missing)}")
        expect = entry.get("expect", "order")
        if expect not in EXPECT:
            raise ClaimsError(f"{where}: expect must be one of {', '.join(EXPECT)}, not {expect!r}")
        comparable = bool(entry.get("comparable", True))
        pairs = [Pair(side(path, c["above"], where), side(path, c["below"], where), str(c.get("label", "")))
                 for c in entry.get("comparisons") or []]
        if comparable and not pairs:
            raise ClaimsError(f"{where}: a comparable claim names every comparison it makes (comparisons = [...])")
        if not comparable and not entry.get("why"):
            raise ClaimsError(f"{where}: a claim that is not comparable says why (why = ...)")
        claims.append(Claim(entry["id"], entry["claim"], entry["source"], entry["number"], entry["release"],
                            entry["protocol"], entry["metric"], pairs, expect, comparable, entry.get("why", ""),
                            entry.get("note", "")))
    return claims


def side(path: Path, data: Any, where: str) -> Side:
    if not isinstance(data, dict) or "encoding" not in data:
        raise ClaimsError(f"{where}: a comparison's side needs an encoding")
    return Side((path.parent / data.get("runs", "runs")).resolve(), str(data["encoding"]), dict(data.get("where", {})))


class Measurer:
    """Measures comparisons over the runs of their folders, each folder read once, one compare's reading."""

    def __init__(self):
        self.comparison = Comparison()
        self.facts = declared_facts()
        self._runs: dict[Path, list[RunRecord]] = {}

    def runs(self, side: Side) -> list[RunRecord]:
        if side.runs not in self._runs:
            if not side.runs.is_dir():
                raise ClaimsError(f"claims: no runs folder {side.runs}")
            self._runs[side.runs] = scan_runs(side.runs)[0]
        found = []
        for run in self._runs[side.runs]:
            if run.encoding != side.encoding:
                continue
            settings = flat(run)
            if all(key in settings and cell(settings[key]) == cell(value) for key, value in side.where.items()):
                found.append(run)
        return found

    def measure(self, claim: Claim) -> list[Outcome]:
        return [self.outcome(claim, pair) for pair in claim.comparisons]

    def outcome(self, claim: Claim, pair: Pair) -> Outcome:
        above, below = self.by_seed(pair.above, claim), self.by_seed(pair.below, claim)
        seeds = sorted(set(above) & set(below), key=str)
        if not seeds:
            raise ClaimsError(f"claim {claim.id!r}: {pair.above.describe()} and {pair.below.describe()} share no seed")
        higher = METRICS.higher_is_better(str(above[seeds[0]].task), claim.metric, True)
        first, second = ([below[s] for s in seeds], [above[s] for s in seeds]) if higher else \
            ([above[s] for s in seeds], [below[s] for s in seeds])          # b minus a: above's advantage
        a = [value_of(r, claim.metric) for r in first]
        b = [value_of(r, claim.metric) for r in second]
        if any(v is None for v in a + b):
            raise ClaimsError(f"claim {claim.id!r}: a run of {pair.above.describe()} or {pair.below.describe()} has "
                              f"no {claim.metric}")
        pairing = example_functions(self.comparison, first, second, claim.metric) or {}
        if pairing:
            strata = tuple(pairing["strata"])
            if strata not in self.comparison.bootstraps:
                self.comparison.bootstraps[strata] = StratifiedBootstrap(strata)
            pairing["bootstrap"] = self.comparison.bootstraps[strata]
        return Outcome(pair, paired_difference(a, b, **pairing), sittings(first, second))

    def by_seed(self, side: Side, claim: Claim) -> dict[Any, RunRecord]:
        runs = [run for run in self.runs(side) if claim.metric in run.metrics]     # the claim's task's runs
        if not runs:
            raise ClaimsError(f"claim {claim.id!r}: no run of {side.describe()} in {side.runs}")
        out: dict[Any, RunRecord] = {}
        for run in sorted(runs, key=lambda r: str(r.finished or "")):
            if run.seed in out and (apart := differing(out[run.seed], run, self.facts)):
                raise ClaimsError(f"claim {claim.id!r}: {side.describe()} matches runs of seed {run.seed} that differ "
                                  f"in {', '.join(apart[:4])}; name the one meant in its 'where'")
            out[run.seed] = run                     # a seed run twice: the newest, as compare keeps it
        return out


def differing(one: RunRecord, other: RunRecord, facts: SettingFacts) -> list[str]:
    """The settings two runs differ in, of those that change what a run computes (``SettingFacts.counts``)."""
    a, b = flat(one), flat(other)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)
                  and (facts.counts(k, a.get(k), one.schema_version) or facts.counts(k, b.get(k), other.schema_version)))


def verdict(claim: Claim, outcomes: list[Outcome]) -> str:
    """The one rule of the module docstring."""
    if not claim.comparable:
        return "not comparable"
    readings = [o.reading for o in outcomes]
    if claim.expect == "alike":
        return "no difference" if all(r == "no difference" for r in readings) else "disagrees"
    if all(r == "supports" for r in readings):
        return "agrees"
    if all(r == "contradicts" for r in readings):
        return "disagrees"
    if all(r == "no difference" for r in readings):
        return "no difference"
    return "mixed"


def render(claims: list[Claim], measurer: Measurer | None = None, release_header: str = RELEASE_HEADER) -> str:
    """The claims table (markdown) with each comparison's interval and the computed verdict, and the rule."""
    measurer = measurer or Measurer()
    lines = [f"| claim | paper's number | {release_header} | posbench | comparisons (above minus below, "
             "95% interval) | verdict |", "|---|---|---|---|---|---|"]
    marked = False
    for claim in claims:
        outcomes = measurer.measure(claim) if claim.comparable else []
        parts = []
        for o in outcomes:
            d = o.difference
            interval = f"[{d.low:+.2f}, {d.high:+.2f}]" if d.low is not None and d.high is not None else "(no interval)"
            mark = " †" if o.across else ""
            marked |= bool(o.across)
            name = o.pair.label or f"{o.pair.above.describe()} vs {o.pair.below.describe()}"
            parts.append(f"{name}: {d.estimate:+.2f} {interval}, {o.reads(claim.expect)}{mark}")
        compared = "; ".join(parts) if parts else f"not measured: {claim.why}"
        said = verdict(claim, outcomes)
        note = f" {claim.note}" if claim.note else ""
        lines.append(f"| {claim.claim} ({claim.source}) | {claim.number} | {claim.release} | {claim.protocol} | "
                     f"{compared} | **{said}**{note} |")
    notes = [f"{RULE}."]
    if marked:
        notes.append("†: the paired runs ran on different machines or from different code (posbench.report.paired."
                     "sittings): the interval holds what that changes too.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def refresh(page_text: str, claims_path: Path, measurer: Measurer | None = None) -> str:
    """The page with its block between ``<!-- claims.toml -->`` and ``<!-- /claims.toml -->`` rewritten."""
    start, end = "<!-- claims.toml -->\n", "<!-- /claims.toml -->"
    if start not in page_text or end not in page_text:
        raise ClaimsError(f"the page has no {start.strip()} ... {end} block for {claims_path}")
    head, rest = page_text.split(start, 1)
    _, tail = rest.split(end, 1)
    data = parsed(claims_path)
    header = str(data.get("release_header", RELEASE_HEADER))
    return head + start + render(claims_in(data, Path(claims_path)), measurer, header) + end + tail
