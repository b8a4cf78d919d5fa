"""How long ``posbench analyze`` takes on a run of the quick start's model (the ``small`` preset's 4 layers x 128,
trained at 256 tokens), with windows up to 8 times its training length, on this machine's cores.

    python benchmarks/analyze_time.py RUN_DIR [RUN_DIR ...]     # finished pretrain or perplexity runs
    python benchmarks/analyze_time.py                           # trains the quick start's two runs first (~8 min)

Each run is analysed ``--repeats`` times at factors 1, 2, 4 and 8 (the default 8,192 held-out tokens a length), in
a fresh process each time (``python -m posbench analyze RUN --force``: start-up and the model's load included), and
the fastest and the median wall-clock seconds are printed, with the torch threads it used. The analysis is written
into each run directory (``analysis.json``, replaced).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def quick_start(root: Path) -> list[Path]:
    subprocess.run([sys.executable, "-m", "posbench", "run", "-e", "rope,alibi", "-t", "perplexity", "-q",
                    "--out", str(root)], check=True)
    return sorted(p.parent for p in root.rglob("result.json") if "checkpoint" not in p.parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = args.runs or quick_start(Path(tempfile.mkdtemp(prefix="analyze-bench-")))
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for run in runs:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "posbench", "analyze", str(run), "--factors", "1,2,4,8", "--force"],
                           check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        print(f"{run}: fastest {min(times):.1f} s, median {statistics.median(times):.1f} s over {len(times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
