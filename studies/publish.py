#!/usr/bin/env python3
"""Publish a finished (or half-finished) ``posbench sweep``: its result files, and the tables, figures and
HTML report that ``posbench compare`` makes of them.

    python studies/publish.py results/studies/cpu-v2 docs/studies/cpu/v2 docs/studies/cpu.md   (from the repository root)

From every cell of the sweep's output (``OUT/cells/<cell id>/``) whose run finished, ``result.json`` (and
``predictions.jsonl`` when the task writes one; gzipped, as ``predictions.jsonl.gz``, when over 256 KiB) is copied
to ``PAGE/runs/<cell id>/``; checkpoints stay behind. Then, over ``PAGE/runs`` only:

    PAGE/tables.md      exactly what ``posbench compare PAGE/runs --against rope --format markdown`` prints,
                        then the same ``--against alibi`` (the papers of KERPLE, Sandwich, DAPE compare to ALiBi);
                        while neither has run, ``## Against none`` and compare's tables without differences;
                        then ``## Every run``: ``--by-run``, one row per cell (each seed's own numbers)
    PAGE/figures/       ``--plots``
    PAGE/report.html    ``--html``
    PAGE/plateau.md     per cell, whether its training loss (or, for a cell with a probe, its probed
                        in-distribution metric) had stopped improving when training ended
                        (``posbench.report.plateau``: the rules are stated there and on the page)
    PAGE/cost.md        the measured time of the finished cells, by task and encoding, and in all
                        (studies/cost.py)

A page (the third argument, by default ``PAGE.md`` beside PAGE, e.g. docs/studies/cpu/v1.md) may quote tables of tables.md between
``<!-- tables.md: BASELINE HEADING -->`` and ``<!-- /tables.md -->`` (BASELINE ``runs`` for ``## Every run``;
HEADING: the line above the table in the
section of that baseline, e.g. ``### perplexity`` or ``**perplexity: difference to rope``); each quote is
rewritten from tables.md. It may also hold whole copies of plateau.md and cost.md, each between a line
``<!-- plateau.md -->`` (or ``<!-- cost.md -->``) and ``<!-- /plateau.md -->``, rewritten likewise. A rerun copies the cells finished since and rewrites all of these, each file
atomically. tests/test_study_tables.py checks that a committed tables.md is what compare prints over the
committed runs, and that the page's quotes are tables.md's, so a page cannot drift from its data.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from posbench.errors import UserError
from posbench.files import atomic_save, atomic_write_text, read_unzipped

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cost  # noqa: E402  (studies/cost.py, a script beside this one)

AGAINST = ("rope", "alibi")      # the tables' baselines: the first is the figures' and the report's too
EVERY_RUN = "Every run"           # tables.md's last section: compare --by-run, one row per cell
TABLES, FIGURES, REPORT, RUNS, PLATEAU, COST = "tables.md", "figures", "report.html", "runs", "plateau.md", "cost.md"
COPIED = ("result.json", "predictions.jsonl")
#: predictions larger than this are kept gzipped (``predictions.jsonl.gz``: the same bytes once decompressed;
#: compare reads either): an arithmetic cell's 10,000 examples are 1.4 MB as text, 0.27 MB gzipped
GZIP_ABOVE = 256 * 1024


class PublishError(Exception):
    """Something the user can fix; ``str()`` is one line."""


def finished_runs(sweep: Path) -> dict[str, Path]:
    """Cell id -> the run directory that holds its result.json, for every finished cell of a sweep."""
    cells = sweep / "cells"
    if not cells.is_dir():
        raise PublishError(f"{sweep} is not the output of posbench sweep (no cells/ folder)")
    runs = {}
    for cell in sorted(p for p in cells.iterdir() if p.is_dir()):
        results = sorted(cell.rglob("result.json"))
        if len(results) > 1:
            raise PublishError(f"cell {cell.name} holds {len(results)} finished runs; keep one")
        if results:
            runs[cell.name] = results[0].parent
    return runs


def copy_runs(runs: dict[str, Path], page: Path) -> int:
    """Copy each run's result files to PAGE/runs/<cell id>/ (predictions over ``GZIP_ABOVE`` bytes gzipped);
    returns how many cells were new or changed."""
    changed = 0
    for cell, run in runs.items():
        target = page / RUNS / cell
        files = [run / name for name in COPIED if (run / name).is_file()]
        if all(published(target, f) == f.read_bytes() for f in files):
            continue
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            if f.name != "result.json" and f.stat().st_size > GZIP_ABOVE:
                data = gzip.compress(f.read_bytes(), compresslevel=9, mtime=0)    # the same bytes every time
                atomic_save(target / (f.name + ".gz"), lambda tmp, data=data: Path(tmp).write_bytes(data))
                (target / f.name).unlink(missing_ok=True)          # never two forms (readers take the plain)
            else:
                atomic_save(target / f.name, lambda tmp, f=f: shutil.copyfile(f, tmp))
                (target / (f.name + ".gz")).unlink(missing_ok=True)
        changed += 1
    return changed


def published(target: Path, source: Path) -> bytes | None:
    """The bytes published for ``source`` in ``target`` (decompressed when kept gzipped), or None."""
    return read_unzipped(target / source.name)


def compare(runs: Path, *options: str) -> str:
    """``posbench compare RUNS OPTIONS`` in a fresh process; its standard output."""
    proc = subprocess.run([sys.executable, "-m", "posbench", "compare", str(runs), *options],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise PublishError(f"posbench compare {runs} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def encodings(runs: Path) -> set[str]:
    """The encodings of the result files under ``runs``."""
    return {json.loads(p.read_text())["config"]["encoding"] for p in runs.rglob("result.json")}


def tables(runs: Path) -> str:
    """The page's tables: compare's markdown with every encoding's paired difference to each baseline it has."""
    present = encodings(runs)
    every_run = f"## {EVERY_RUN}\n\n" + compare(runs, "--by-run", "--format", "markdown") + "\n"
    if not any(name in present for name in AGAINST):       # no baseline has run yet: the tables alone
        return "## Against none\n\n" + compare(runs, "--format", "markdown") + "\n" + every_run
    return "".join(f"## Against {name}\n\n" + compare(runs, "--against", name, "--format", "markdown") + "\n"
                   for name in AGAINST if name in present) + every_run


QUOTE = re.compile(r"(<!-- tables\.md: (\w+) (.+?) -->)(.*?)(<!-- /tables\.md -->)", re.S)


def sections(text: str) -> dict[str, str]:
    """tables.md by section: {"rope": the text under "## Against rope", ..., "runs": the text under "## Every run"}
    (a page quotes the per-cell tables as ``<!-- tables.md: runs ### passkey -->``)."""
    found = dict(re.findall(r"^## Against (\w+)\n(.*?)(?=^## |\Z)", text, re.S | re.M))
    every = re.search(rf"^## {EVERY_RUN}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return {**found, **({"runs": every.group(1)} if every else {})}


def table_after(text: str, heading: str) -> str:
    """The markdown table that follows the line starting with ``heading`` in ``text``."""
    lines = iter(text[text.index("\n" + heading) + 1:].splitlines()[1:])
    rows: list[str] = []
    for line in lines:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    if not rows:
        raise PublishError(f"no table after '{heading}'")
    return "\n".join(rows)


def refresh_quotes(page_text: str, tables_text: str) -> str:
    """Every quote of the page rewritten from tables.md (see the module docstring)."""
    by_baseline = sections(tables_text)

    def quoted(match: re.Match) -> str:
        baseline, heading = match.group(2), match.group(3)
        if baseline not in by_baseline or "\n" + heading not in by_baseline[baseline]:
            raise PublishError(f"the page quotes '{heading}' against {baseline}, which tables.md does not hold")
        return match.group(1) + "\n" + table_after(by_baseline[baseline], heading) + "\n" + match.group(5)

    return QUOTE.sub(quoted, page_text)


def plateaus(runs: Path) -> str:
    """plateau.md: every cell's verdict (``posbench.report.plateau``), cells in name order: on its probe for a
    cell that has one (the arithmetic task's in-distribution accuracy), else on its training loss."""
    from posbench.report.plateau import plateau_table, probe_name, probe_plateau_table

    records = {p.parent.name: json.loads(p.read_text()) for p in sorted(runs.glob("*/result.json"))}
    probed = {cell: r for cell, r in records.items() if probe_name(r) is not None}
    unprobed = {cell: r for cell, r in records.items() if cell not in probed}
    tables = ([plateau_table(unprobed)] if unprobed or not probed else []) + \
        ([probe_plateau_table(probed)] if probed else [])
    return "\n".join(tables)


def refresh_copy(page_text: str, name: str, text: str) -> str:
    """The page's copies of a whole file (each between a line ``<!-- NAME -->`` and ``<!-- /NAME -->``, e.g.
    plateau.md), rewritten; a copy whose markers do not pair up is refused rather than rewritten across the prose
    between two copies."""
    opening, closing = f"<!-- {name} -->", f"<!-- /{name} -->"
    body = rf"(?:(?!{re.escape(opening)}).)*?"          # never across another copy's opening marker
    quote = re.compile(rf"({re.escape(opening)}\n)({body})({re.escape(closing)})", re.S)
    fresh, copies = quote.subn(lambda m: m.group(1) + text + m.group(3), page_text)
    if copies != page_text.count(opening) or copies != page_text.count(closing):
        raise PublishError(f"the page's copies of {name} do not pair up: {page_text.count(opening)} '{opening}' "
                           f"(each alone on its line), {page_text.count(closing)} '{closing}'")
    return fresh


def write_page(page: Path, text_page: Path | None = None) -> None:
    atomic_write_text(page / TABLES, tables(page / RUNS))
    atomic_write_text(page / PLATEAU, plateaus(page / RUNS))
    atomic_write_text(page / COST, cost.cost(page / RUNS))
    text_page = text_page or page.with_suffix(".md")
    if text_page.is_file():
        text = refresh_quotes(text_page.read_text(), (page / TABLES).read_text())
        for name in (PLATEAU, COST):
            text = refresh_copy(text, name, (page / name).read_text())
        atomic_write_text(text_page, text)
    present = encodings(page / RUNS)
    baseline = next((["--against", name] for name in AGAINST if name in present), [])   # none until one has run
    compare(page / RUNS, *baseline, "--plots", str(page / FIGURES), "--html", str(page / REPORT), "--force")


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python studies/publish.py SWEEP_OUT PAGE_DIR [PAGE.md]", file=sys.stderr)
        return 2
    sweep, page = Path(argv[0]), Path(argv[1])
    text_page = Path(argv[2]) if len(argv) == 3 else None
    try:
        runs = finished_runs(sweep)
        if not runs and not (page / RUNS).is_dir():
            raise PublishError(f"no cell of {sweep} has finished yet")
        changed = copy_runs(runs, page)
        write_page(page, text_page)
    except (PublishError, UserError) as exc:        # UserError: a file that cannot be written, in one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(runs)} finished cell(s), {changed} new; wrote {page / TABLES}, {page / PLATEAU}, {page / COST}, "
          f"{page / FIGURES}/, {page / REPORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
