"""Benchmark: the arithmetic task's ``small`` preset for RoPE and TAPE on this machine.

Records each encoding's wall time (training + evaluation, as ``posbench run`` spends it) and its
in-distribution, out-of-distribution and whole-grid accuracies, checks the target (in-distribution
accuracy >= 90% within 10 minutes per encoding) and writes a summary.

    python benchmarks/arithmetic_small.py                      # rope and tape, seed 0
    python benchmarks/arithmetic_small.py --encodings rope,tape,alibi --threads 1
    python benchmarks/arithmetic_small.py --summary results/reference/arithmetic_small.json

Full run directories go under ``--out`` (default ``results/bench``, git-ignored); the summary (with each
run's complete result.json embedded) goes to ``--summary`` (default ``results/reference/arithmetic_small.json``,
committed).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

TARGET_ID_ACCURACY = 90.0
TARGET_WALL_S = 600.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encodings", default="rope,tape")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: every core we may use)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("--summary", default="results/reference/arithmetic_small.json")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="extra key=value overrides")
    parser.add_argument("--note", default="", help="free text stored with the numbers (e.g. machine load)")
    args = parser.parse_args()

    import torch

    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.reporters import RichReporter

    sets = list(args.sets) + ([f"train.threads={args.threads}"] if args.threads else [])
    rows = []
    for encoding in [e.strip() for e in args.encodings.split(",") if e.strip()]:
        config = resolve_run_config("arithmetic", encoding, args.preset, seed=args.seed, device=args.device,
                                    sets=sets)
        load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        start = time.perf_counter()
        outcome = runner.execute(config, args.out, reporter=RichReporter(log_every=250),
                                 command=["benchmarks/arithmetic_small.py", *sys.argv[1:]])
        wall = time.perf_counter() - start
        load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        result = outcome.record.to_dict()
        metrics = {name: m["value"] for name, m in result["metrics"].items()}
        row = {"encoding": encoding, "wall_s": round(wall, 1), "train_s": result["timings"]["train_s"],
               "eval_s": result["timings"]["eval_s"], "steps": result["training"]["steps"],
               "accuracy_id": metrics.get("accuracy_id"), "accuracy_ood": metrics.get("accuracy_ood"),
               "accuracy": metrics.get("accuracy"), "final_loss": result["training"]["final_loss"],
               "load_average_1m": [load_before, load_after], "run_dir": str(outcome.run_dir),
               "meets_target": bool((metrics.get("accuracy_id") or 0) >= TARGET_ID_ACCURACY
                                    and wall <= TARGET_WALL_S)}
        rows.append({**row, "result": result})
        print(f"{encoding}: wall {wall:.0f}s (train {row['train_s']:.0f}s, eval {row['eval_s']:.0f}s)  "
              f"ID {row['accuracy_id']:.1f}%  OOD {row['accuracy_ood']:.1f}%  grid {row['accuracy']:.1f}%  "
              f"{'meets' if row['meets_target'] else 'MISSES'} the target", flush=True)

    summary = {
        "benchmark": "arithmetic small preset",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version()},
        "target": {"accuracy_id_min": TARGET_ID_ACCURACY, "wall_s_max": TARGET_WALL_S},
        "note": args.note,
        "runs": rows,
    }
    path = Path(args.summary)
    path.parent.mkdir(parents=True, exist_ok=True)
    from posbench.files import atomic_write_json

    atomic_write_json(path, summary)
    print()
    print("| encoding | wall time | train | eval | in-distribution | out-of-distribution | whole grid |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['encoding']} | {r['wall_s']:.0f} s | {r['train_s']:.0f} s | {r['eval_s']:.0f} s | "
              f"{r['accuracy_id']:.1f}% | {r['accuracy_ood']:.1f}% | {r['accuracy']:.1f}% |")
    print(f"\nwrote {path}")
    return 0 if all(r["meets_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
