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
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from posbench.files import atomic_write_json, atomic_write_text, read_unzipped

RUNS, COPIED = "runs", ("result.json", "predictions.jsonl")


def restore(page: Path, out: Path) -> list[str]:
    """The cells restored (those already finished in ``out`` are skipped)."""
    restored = []
    for result in sorted((page / RUNS).glob("*/result.json")):
        cell = result.parent.name
        cell_dir = out / "cells" / cell
        if any(cell_dir.glob("*/*/*/result.json")):
            continue
        record = json.loads(result.read_text())
        run_dir = cell_dir / record["task"] / record["encoding"] / record["run_id"]
        run_dir.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in record["config"].items() if k != "model_config"}    # as runs/store.py writes
        atomic_write_json(run_dir / "config.json", {"config": config, "created": record.get("created"),
                                                    "command": record.get("command") or []})
        for name in COPIED[1:]:
            data = read_unzipped(result.parent / name)                 # publish.py gzips large predictions
            if data is not None:
                atomic_write_text(run_dir / name, data.decode("utf-8"))
        atomic_write_text(run_dir / "result.json", result.read_text())     # last: the cell counts as finished
        restored.append(cell)
    return restored


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not (Path(argv[0]) / RUNS).is_dir():
        print("usage: python studies/restore.py PAGE_DIR SWEEP_OUT (PAGE_DIR holds runs/, as publish.py writes it)",
              file=sys.stderr)
        return 2
    cells = restore(Path(argv[0]), Path(argv[1]))
    print(f"{len(cells)} finished cell(s) restored into {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
