"""What tiny runs of every task compute, fingerprinted, to prove a refactor changes no number: the SHA-256 of each
run's saved weights and optimizer state, its metrics and its recorded configuration, as JSON lines.

    python tools/fingerprints.py BASE.jsonl --checkout DIR    # DIR: the checkout before the change (a git worktree)
    python tools/fingerprints.py NOW.jsonl --against BASE.jsonl  # this checkout; exit 1 and the differences if any

Each case is a ``posbench run`` command line, flags as a user types them, so that parsing is covered too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: name -> the ``posbench run`` arguments (each at the tiny preset, seed 0)
CASES = {
    "arithmetic-rope": ["-e", "rope", "-t", "arithmetic", "--steps", "6"],
    "arithmetic-tape": ["-e", "tape", "-t", "arithmetic", "--set", "train.steps=6"],
    "arithmetic-fire-L": ["-e", "fire", "-t", "arithmetic", "--steps", "6", "--init-l", "512"],
    "arithmetic-t5": ["-e", "t5", "-t", "arithmetic", "--steps", "6", "--table-init", "t5"],
    "arithmetic-abacus-recurrent": ["-e", "abacus", "-t", "arithmetic", "--steps", "6", "--set", "model.norm=layer",
                                    "--set", "model.norm_position=post", "--set", "model.recurrences=2",
                                    "--set", "model.input_injection=true", "--set", "model.init_scheme=deepnorm"],
    "arithmetic-alibi-lr": ["-e", "alibi", "-t", "arithmetic", "--steps", "6", "--lr", "3e-3", "--seed", "1"],
    "perplexity-rope-theta": ["-e", "rope", "-t", "perplexity", "--steps", "4", "--theta", "500"],
    "perplexity-nope-start": ["-e", "nope", "-t", "perplexity", "--steps", "4", "--set", "task.start_token=true"],
    "passkey-xpos": ["-e", "xpos", "-t", "passkey", "--steps", "4"],
    "passkey-randpe": ["-e", "randpe", "-t", "passkey", "--steps", "4"],
    "scrolls-alibi": ["-e", "alibi", "-t", "scrolls", "--steps", "4", "--data", str(ROOT / "tests/fixtures/scrolls")],
    "ruler-kerple": ["-e", "kerple", "-t", "ruler", "--steps", "4"],
    "pretrain-cope": ["-e", "cope", "-t", "pretrain", "--steps", "4"],
    "arithmetic-dape-sandwich": ["-e", "dape,sandwich", "-t", "arithmetic", "--steps", "4"],
}
HASHED = ("model.safetensors", "optimizer.safetensors")
#: recorded facts that differ between two identical runs
VOLATILE = {"run_id", "created", "finished", "command", "posbench", "environment", "timings", "training"}


def fingerprint(run: Path) -> dict:
    record = json.loads((run / "result.json").read_text())
    hashes = {name: hashlib.sha256((run / "checkpoint" / name).read_bytes()).hexdigest()
              for name in HASHED if (run / "checkpoint" / name).exists()}
    kept = {k: v for k, v in record.items() if k not in VOLATILE}
    kept["training"] = record.get("training", {})
    return {"weights": hashes, "record": untimed(kept)}


def untimed(value):
    """``value`` without its measured times at any depth (keys ending ``_s`` or ``per_s``: seconds, rates)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not k.endswith(("_s", "per_s"))}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--only", nargs="*", default=None, help="these cases only")
    parser.add_argument("--against", type=Path, default=None, help="fingerprints to compare with")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.checkout.resolve())}
    lines = []
    for name, argv in CASES.items():
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-P", "-m", "posbench", "run", "-p", "tiny", "-q", "--out", tmp, "--device", "cpu",
                   *argv]
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                lines.append({"case": name, "failed": (proc.stderr or proc.stdout).strip()[-400:]})
                continue
            for result in sorted(Path(tmp).rglob("result.json")):
                lines.append({"case": name, "run": str(result.parent.relative_to(tmp).parent),
                              **fingerprint(result.parent)})
    with open(args.out, "w") as fh:
        for line in lines:
            fh.write(json.dumps(line, sort_keys=True) + "\n")
    failed = [line["case"] for line in lines if "failed" in line]
    print(f"{len(lines)} runs fingerprinted; failed: {failed or 'none'}", file=sys.stderr)
    return differences(lines, args.against) if args.against else (1 if failed else 0)


def differences(lines: list[dict], base_file: Path) -> int:
    """Print each run whose fingerprint differs from the base's (cases absent from the base are listed too)."""
    base = {(b["case"], b.get("run")): b for b in map(json.loads, base_file.read_text().splitlines())}
    differ = 0
    for line in lines:
        old = base.get((line["case"], line.get("run")))
        if old != line:
            differ += 1
            where = "absent from the base" if old is None else ", ".join(
                k for k in sorted(set(line) | set(old)) if line.get(k) != old.get(k))
            print(f"DIFFERS {line['case']} {line.get('run', '')}: {where}")
            if old is not None and line.get("record") and old.get("record"):
                for k in sorted(set(line["record"]) | set(old["record"])):
                    if line["record"].get(k) != old["record"].get(k):
                        print(f"    record.{k}: {str(old['record'].get(k))[:300]}\n         -> {str(line['record'].get(k))[:300]}")
    print(f"{len(lines) - differ} of {len(lines)} runs bitwise as the base" , file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
