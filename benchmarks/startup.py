"""How long the commands that build no model take to start and finish: ``posbench --help``, ``posbench ls`` (every
listing) and ``posbench compare`` of a small folder of committed records (``docs/reference-runs``: six perplexity
runs), and ``compare --against`` of records with per-example predictions (RoPE and ALiBi on arithmetic, paired example
by example), each in a fresh process, and whether each imported torch (issue 58: under 0.5 s on two cores, torch
never).

    python benchmarks/startup.py                  # 5 runs of each, the median and the fastest
    python benchmarks/startup.py --repeats 9

Each command runs as ``python -m posbench ...`` with its output thrown away; a second process per command
(``python -X importtime``) tells whether torch was imported. The machine's load counts: say it beside the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"--help": ["--help"], "ls": ["ls"], "compare": ["compare", str(ROOT / "docs" / "reference-runs")],
            "compare --against": ["compare", str(ROOT / "tests" / "fixtures" / "results-v1" / "arithmetic"),
                                  "--against", "rope"]}


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "posbench", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True, env={**os.environ, "COLUMNS": "120"})
    return time.perf_counter() - start


def imports_torch(args: list[str]) -> bool:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "posbench", *args], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in done.stderr.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'command':<17} {'median s':>9} {'fastest s':>9}  torch   ({os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f})")
    for name, argv in COMMANDS.items():
        times = [timed(argv) for _ in range(args.repeats)]
        print(f"{name:<17} {statistics.median(times):9.2f} {min(times):9.2f}  {'yes' if imports_torch(argv) else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
