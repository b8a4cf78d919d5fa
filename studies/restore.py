#!/usr/bin/env python3
"""Put a published study's finished cells back into a sweep's output, so that a later sitting resumes the study
where the published files end (a study of several sittings on machines that keep nothing but the repository):

    python studies/restore.py docs/studies/cpu/v2 results/studies/cpu-v2        (run from the repository root)
    posbench sweep studies/cpu.toml --out results/studies/cpu-v2 --jobs 2       (skips every restored cell)

Each ``PAGE/runs/<cell id>/`` (what studies/publish.py copied: ``result.json``, ``predictions.jsonl`` or its
``.gz``) becomes
``OUT/cells/<cell id>/<task>/<encoding>/<run id>/`` with those files and the run's ``config.json`` (its recorded
configuration), which is what the sweep reads as a finished cell. A cell that already holds a finished run is
left alone; nothing is overwritten.

``task``, ``encoding`` and ``run_id`` come from each result.json, which is data: each must be one folder name
(not empty, not ``.`` or ``..``, no ``/``, ``\\`` or control character), so that every file written stays inside
its cell's folder. Every published cell is checked before anything is written; the first that is not right is
one line (``error: ...``, exit code 2) and nothing is restored. A published cell folder or file that is a
symbolic link is not followed, and a file larger than compare reads (its gzipped predictions counted as what
they inflate to, studies/publish.py's ``LIMITS``) is not read: the cell is skipped, with a line saying so.
"""

from __future__ import annotations

import json
import sys
import unicodedata
import zlib
from pathlib import Path
from typing import Any

from posbench.errors import UserError
from posbench.files import atomic_write_json, atomic_write_text, plain_or_gzipped

sys.path.insert(0, str(Path(__file__).resolve().parent))
from publish import PublishError, read_limited, too_large  # noqa: E402  (studies/publish.py, a script beside this one)

RUNS, COPIED = "runs", ("result.json", "predictions.jsonl")
NAMED = ("task", "encoding", "run_id")        # the result.json keys that name the run's folders


class RestoreError(Exception):
    """A published cell that cannot be restored as it is; ``str()`` is one line."""


def folder_name(value: Any, what: str, where: Path) -> str:
    """``value`` when it is one folder name (the last part of a path, nothing above or beside it)."""
    if not isinstance(value, str) or not value:
        raise RestoreError(f"{where}: {what} {value!r} is not a name")
    bad = ("it is empty" if not value.strip() else
           "it names a folder above (..)" if value in (".", "..") else
           "it holds a / or \\ (a path, not one folder name)" if "/" in value or "\\" in value else
           "it holds a control character" if any(unicodedata.category(c) == "Cc" for c in value) else
           "it is longer than a folder name may be" if len(value.encode("utf-8")) > 255 else "")
    if bad:
        raise RestoreError(f"{where}: {what} {value!r} is not one folder name ({bad}); the run would be written "
                           f"outside its cell's folder")
    return value


def planned(page: Path, out: Path, skipped: list[str]) -> list[tuple[str, Path, Path, dict[str, Any]]]:
    """(cell, its published result.json, the run folder to write, the record) for each published cell to restore,
    every one checked; cells already finished in ``out`` and links left out (links with a line in ``skipped``)."""
    found = []
    for result in sorted((page / RUNS).glob("*/result.json")):
        cell = result.parent.name
        links = [p for p in (result.parent, *(result.parent / n for n in (*COPIED, COPIED[1] + ".gz")))
                 if p.is_symlink()]
        if links:
            skipped.append(f"skipped cell {cell}: {links[0]} is a symbolic link; restore copies only the page's "
                           f"own files")
            continue
        cell_dir = out / "cells" / folder_name(cell, "the cell", result)
        if any(cell_dir.glob("*/*/*/result.json")):
            continue
        files = [f for f in (result, plain_or_gzipped(result.parent / COPIED[1])) if f is not None]
        try:
            large = next((why for why in map(too_large, files) if why), "")
        except (OSError, EOFError, zlib.error) as exc:
            raise RestoreError(f"cannot read {result.parent}: {(str(exc).splitlines() or [type(exc).__name__])[0]}") \
                from None
        if large:
            skipped.append(f"skipped cell {cell}: {large}, the most restore reads of it")
            continue
        try:
            record = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise RestoreError(f"cannot read {result}: {reason}") from None
        if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
            raise RestoreError(f"{result} is not a posbench result (no config)")
        parts = [folder_name(record.get(key), key, result) for key in NAMED]
        run_dir = cell_dir.joinpath(*parts)
        if not run_dir.resolve().is_relative_to(cell_dir.resolve()):      # a link already in the output
            raise RestoreError(f"{result}: {run_dir} would lie outside {cell_dir}")
        found.append((cell, result, run_dir, record))
    return found


def restore(page: Path, out: Path, skipped: list[str] | None = None) -> list[str]:
    """The cells restored (those already finished in ``out`` are skipped)."""
    skipped = [] if skipped is None else skipped
    restored = []
    for cell, result, run_dir, record in planned(page, out, skipped):
        run_dir.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in record["config"].items() if k != "model_config"}    # as runs/store.py writes
        atomic_write_json(run_dir / "config.json", {"config": config, "created": record.get("created"),
                                                    "command": record.get("command") or []})
        for name in COPIED[1:]:
            found = plain_or_gzipped(result.parent / name)             # publish.py gzips large predictions
            if found is not None:
                atomic_write_text(run_dir / name, read_limited(found).decode("utf-8"))
        atomic_write_text(run_dir / "result.json", result.read_text())     # last: the cell counts as finished
        restored.append(cell)
    return restored


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not (Path(argv[0]) / RUNS).is_dir():
        print("usage: python studies/restore.py PAGE_DIR SWEEP_OUT (PAGE_DIR holds runs/, as publish.py writes it)",
              file=sys.stderr)
        return 2
    skipped: list[str] = []
    try:
        cells = restore(Path(argv[0]), Path(argv[1]), skipped)
    except (RestoreError, PublishError, UserError, UnicodeDecodeError) as exc:   # UserError: a write refused
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in skipped:
        print(line, file=sys.stderr)
    print(f"{len(cells)} finished cell(s) restored into {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
