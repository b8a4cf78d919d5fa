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
    the page's claims   where PAGE/claims.toml exists, the page's block between ``<!-- claims.toml -->`` and
                        ``<!-- /claims.toml -->`` is the claims table with its verdicts computed from the runs
                        (``posbench.report.claims``: one rule for every study)

A page (the third argument, by default ``PAGE.md`` beside PAGE, e.g. docs/studies/cpu/v1.md) may quote tables of tables.md between
``<!-- tables.md: BASELINE HEADING -->`` and ``<!-- /tables.md -->`` (BASELINE ``runs`` for ``## Every run``;
HEADING: the line above the table in the
section of that baseline, e.g. ``### perplexity`` or ``**perplexity: difference to rope``); each quote is
rewritten from tables.md. It may also hold whole copies of plateau.md and cost.md, each between a line
``<!-- plateau.md -->`` (or ``<!-- cost.md -->``) and ``<!-- /plateau.md -->``, rewritten likewise. A rerun copies the cells finished since and rewrites all of these, each file
atomically. tests/report/test_study_tables.py checks that a committed tables.md is what compare prints over the
committed runs, and that the page's quotes are tables.md's, so a page cannot drift from its data.

Only what is inside the sweep is copied, and only inside the page is written: a cell folder, a run folder or a
result file of the sweep that is a symbolic link is skipped, with a line saying so; a page whose ``runs/`` (or
anything in it) or ``figures/`` is a symbolic link is refused before anything is written. A copy's mode is
never wider than its original's (nor than the usual mode of a new file). A cell whose result.json or
predictions are larger than compare reads (``LIMITS``) is skipped with a line. compare runs as ``python -P -m
posbench``: the working directory is not on its module path.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from posbench import files as posbench_files
from posbench.errors import UserError, os_error
from posbench.files import atomic_write_text
from posbench.report import claims

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cost  # noqa: E402  (studies/cost.py, a script beside this one)

AGAINST = ("rope", "alibi")      # the tables' baselines: the first is the figures' and the report's too
EVERY_RUN = "Every run"           # tables.md's last section: compare --by-run, one row per cell
TABLES, FIGURES, REPORT, RUNS, PLATEAU, COST = "tables.md", "figures", "report.html", "runs", "plateau.md", "cost.md"
COPIED = ("result.json", "predictions.jsonl", "code.patch", "analysis.json")
CLAIMS = claims.CLAIMS_FILE
#: the repository whose history a published run's code must be in (this script's own)
REPOSITORY = Path(__file__).resolve().parents[1]
#: predictions larger than this are kept gzipped (``predictions.jsonl.gz``: the same bytes once decompressed;
#: compare reads either): an arithmetic cell's 10,000 examples are 1.4 MB as text, 0.27 MB gzipped
GZIP_ABOVE = 256 * 1024


#: the most publish (and restore.py) reads of a result file, as compare (``posbench.files``): a gzipped file
#: counts what it inflates to; a cell with a larger one is skipped, with a line saying so
LIMITS = {"result.json": getattr(posbench_files, "MAX_RESULT_BYTES", 64 * 2**20),
          "predictions.jsonl": getattr(posbench_files, "MAX_PREDICTIONS_BYTES", 256 * 2**20),
          "code.patch": getattr(posbench_files, "MAX_RESULT_BYTES", 64 * 2**20),
          "analysis.json": getattr(posbench_files, "MAX_RESULT_BYTES", 64 * 2**20)}


class PublishError(Exception):
    """Something the user can fix; ``str()`` is one line."""


def size_text(n: int) -> str:
    return f"{n / 2**20:g} MB" if n >= 2**20 else f"{n:,} bytes"


def too_large(path: Path) -> str:
    """Why ``path`` is past its bound (``LIMITS``, by its name without ``.gz``), or "" when it is not; a gzipped
    file is inflated in chunks, never whole, to find out."""
    gzipped = path.name.endswith(".gz")
    limit = LIMITS[path.name.removesuffix(".gz")]
    if not gzipped:
        size = path.stat().st_size
    else:
        size = 0
        with gzip.open(path, "rb") as fh:
            while size <= limit and (block := fh.read(1 << 20)):
                size += len(block)
    return f"{path} {'inflates to' if gzipped else 'is'} more than {size_text(limit)}" if size > limit else ""


def read_limited(path: Path) -> bytes:
    """The bytes of ``path`` (what it inflates to, for ``.gz``), at most its bound: PublishError past it."""
    limit = LIMITS[path.name.removesuffix(".gz")]
    with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise PublishError(f"{path} {'inflates to' if path.name.endswith('.gz') else 'is'} more than "
                           f"{size_text(limit)}, the most publish reads of it")
    return data


def finished_runs(sweep: Path, skipped: list[str] | None = None) -> dict[str, Path]:
    """Cell id -> the run directory that holds its result.json, for every finished cell of a sweep. A cell folder,
    a folder in it, or a result file that is a symbolic link is not followed: the cell is skipped, and a line
    saying so is added to ``skipped``."""
    cells = sweep / "cells"
    if not cells.is_dir():
        raise PublishError(f"{sweep} is not the output of posbench sweep (no cells/ folder)")
    skipped = [] if skipped is None else skipped
    runs = {}
    for cell in sorted(p for p in cells.iterdir() if p.is_dir()):
        if cell.is_symlink():
            skipped.append(f"skipped cell {cell.name}: its folder is a symbolic link ({cell} -> "
                           f"{os.readlink(cell)}); publish copies only what is inside the sweep")
            continue
        results, links = [], []
        for folder, dirs, names in os.walk(cell):           # links are listed, never followed
            here = Path(folder)
            links += [here / d for d in dirs if (here / d).is_symlink()]
            if "result.json" in names:
                results.append(here / "result.json")
        links += [run / name for run in (r.parent for r in results) for name in (*COPIED, COPIED[1] + ".gz")
                  if (run / name).is_symlink()]
        if links:
            skipped.append(f"skipped cell {cell.name}: {links[0].relative_to(cells)} is a symbolic link "
                           f"(-> {os.readlink(links[0])}); publish copies only what is inside the sweep")
            continue
        if len(results) > 1:
            raise PublishError(f"cell {cell.name} holds {len(results)} finished runs; keep one")
        large = [why for why in (too_large(r.parent / name) for r in results for name in COPIED
                                 if (r.parent / name).is_file()) if why]
        if large:
            skipped.append(f"skipped cell {cell.name}: {large[0]}, the most publish reads of it")
            continue
        if results:
            runs[cell.name] = results[0].parent
    return runs


def no_links_in_page(page: Path) -> None:
    """Refuse a page whose ``runs/`` or ``figures/`` (or anything in ``runs/``) is a symbolic link: publish and
    compare would write or read through it, outside the page."""
    for place in (page / RUNS, page / FIGURES):
        if place.is_symlink():
            raise PublishError(f"{place} is a symbolic link (-> {os.readlink(place)}); a page holds its own files: "
                               f"remove the link, or give another page folder")
    if (page / RUNS).is_dir():
        for folder, dirs, names in os.walk(page / RUNS):
            for name in [*dirs, *names]:
                if (Path(folder) / name).is_symlink():
                    link = Path(folder) / name
                    raise PublishError(f"{link} is a symbolic link (-> {os.readlink(link)}); a page holds its own "
                                       f"files: remove the link")


def read_copied(path: Path) -> tuple[bytes, int]:
    """The bytes of a file to copy and the mode to give its copy: never wider than the original's, nor than a new
    file's usual mode. Opened without following a link (a link is refused), a regular file only."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise PublishError(f"cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PublishError(f"{path} is not a regular file")
        data = fh.read(LIMITS[path.name] + 1)
        if len(data) > LIMITS[path.name]:
            raise PublishError(f"{path} is more than {size_text(LIMITS[path.name])}, the most publish reads of it")
        return data, stat.S_IMODE(st.st_mode) & 0o666 & ~UMASK


def save(path: Path, data: bytes, mode: int) -> None:
    """``data`` to ``path`` atomically (a temporary file beside it, then a rename), created with ``mode``: the copy
    is never, even for a moment, readable by more than its original."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)     # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise os_error(OSError(exc.errno, exc.strerror, str(path)), "write") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


def copy_runs(runs: dict[str, Path], page: Path) -> int:
    """Copy each run's result files to PAGE/runs/<cell id>/ (predictions over ``GZIP_ABOVE`` bytes gzipped);
    returns how many cells were new or changed."""
    no_links_in_page(page)
    changed = 0
    for cell, run in runs.items():
        target = page / RUNS / cell
        copied = {run / name: read_copied(run / name) for name in COPIED if (run / name).is_file()}
        if all(published(target, f) == data for f, (data, _) in copied.items()):
            continue
        target.mkdir(parents=True, exist_ok=True)
        for f, (data, mode) in copied.items():
            if f.name != "result.json" and len(data) > GZIP_ABOVE:
                save(target / (f.name + ".gz"), gzip.compress(data, compresslevel=9, mtime=0), mode)   # same bytes
                (target / f.name).unlink(missing_ok=True)          # never two forms (readers take the plain)
            else:
                save(target / f.name, data, mode)
                (target / (f.name + ".gz")).unlink(missing_ok=True)
        changed += 1
    return changed


def refuse_unrecoverable(runs: dict[str, Path], repo: Path = REPOSITORY) -> None:
    """One line (``PublishError``) for the first cell whose code cannot be rebuilt from ``repo``'s history
    (``posbench.runs.code.unrecoverable``: a commit in no history, a patch missing or altered, a dirty tree with no
    patch): a published number must name code a reader can check out."""
    from posbench.runs.code import unrecoverable

    for cell, run in runs.items():
        record = json.loads(read_limited(run / "result.json"))
        reason = unrecoverable(record.get("posbench") or {}, run, repo)
        if reason is not None:
            raise PublishError(f"{cell}: its code cannot be recovered: {reason}; rerun the cell from a published "
                               f"commit")


def published(target: Path, source: Path) -> bytes | None:
    """The bytes published for ``source`` in ``target`` (decompressed when kept gzipped), or None (also for a
    link, which is then replaced by the file)."""
    for path in (target / source.name, target / (source.name + ".gz")):
        if path.is_symlink():
            return None
        if path.is_file():
            try:
                return read_limited(path)
            except (PublishError, OSError, EOFError, zlib.error):    # past its bound, or a broken .gz: rewritten
                return None
    return None


#: how compare is started: ``-P`` keeps the working directory off the module path (with ``-m`` alone Python puts
#: it first, and a ``posbench/`` or an ``fcntl.py`` there would be imported instead of the real one)
POSBENCH = [sys.executable, "-P", "-m", "posbench"]


def compare(runs: Path, *options: str) -> str:
    """``posbench compare RUNS OPTIONS`` in a fresh process; its standard output."""
    proc = subprocess.run([*POSBENCH, "compare", str(runs), *options], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PublishError(f"posbench compare {runs} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def encodings(runs: Path) -> set[str]:
    """The encodings of the result files under ``runs``."""
    return {json.loads(p.read_text())["config"]["encoding"] for p in runs.rglob("result.json")}


def tables(runs: Path) -> str:
    """The page's tables: compare's markdown with every encoding's paired difference to each baseline it has,
    then one row per run: what ``posbench compare RUNS [--against NAME | --by-run] --format markdown`` prints
    (``commands_tables`` runs those commands; a test holds the two equal), made in this process from one
    ``Comparison``, so that each predictions file is read once and each run resampled once for every baseline."""
    from posbench import report
    from posbench.report.comparison import Comparison

    comparison = Comparison()

    def markdown(**how) -> str:
        result = report.collect(runs, comparison=comparison, **how)
        if not result.tables:
            raise PublishError(f"posbench compare {runs}: no finished runs")
        return report.render_text(result, "markdown")

    return assemble(runs, lambda name: markdown(against=name), lambda: markdown(by_run=True), lambda: markdown())


def commands_tables(runs: Path) -> str:
    """``tables(runs)`` by running ``posbench compare`` once per section, each in a fresh process."""
    return assemble(runs, lambda name: compare(runs, "--against", name, "--format", "markdown"),
                    lambda: compare(runs, "--by-run", "--format", "markdown"),
                    lambda: compare(runs, "--format", "markdown"))


def assemble(runs: Path, against, by_run, alone) -> str:
    """tables.md's sections: ``against(name)`` for each baseline present (``alone()`` when none is), then
    ``by_run()``."""
    present = encodings(runs)
    if not any(name in present for name in AGAINST):       # no baseline has run yet: the tables alone
        sections = "## Against none\n\n" + alone() + "\n"
    else:
        sections = "".join(f"## Against {name}\n\n" + against(name) + "\n" for name in AGAINST if name in present)
    return sections + f"## {EVERY_RUN}\n\n" + by_run() + "\n"


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
    no_links_in_page(page)
    atomic_write_text(page / TABLES, tables(page / RUNS))
    atomic_write_text(page / PLATEAU, plateaus(page / RUNS))
    atomic_write_text(page / COST, cost.cost(page / RUNS))
    text_page = text_page or page.with_suffix(".md")
    if text_page.is_file():
        text = refresh_quotes(text_page.read_text(), (page / TABLES).read_text())
        for name in (PLATEAU, COST):
            text = refresh_copy(text, name, (page / name).read_text())
        if (page / CLAIMS).is_file():                   # the claims table, its verdicts computed from the runs
            text = claims.refresh(text, page / CLAIMS)
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
        skipped: list[str] = []
        runs = finished_runs(sweep, skipped)
        for line in skipped:
            print(line, file=sys.stderr)
        if not runs and not (page / RUNS).is_dir():
            raise PublishError(f"no cell of {sweep} has finished yet")
        refuse_unrecoverable(runs)
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
