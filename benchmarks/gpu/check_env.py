"""The first thing every GPU call runs: can this python run posbench? Imports each module the GPU scripts need and
runs the CLI's argument parsing (typer, with pydantic), names every one that fails and why, and writes the
environment (torch, CUDA, the device) to ``$OUT/env.txt``. Exit code 1 if anything is missing."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

MODULES = ["torch", "numpy", "typer", "click", "rich", "pydantic", "pydantic_core", "annotated_types",
           "typing_inspection", "shellingham", "markdown_it", "pygments", "safetensors", "pytest",
           "posbench.cli", "posbench.model", "posbench.tasks.bench"]


def main() -> int:
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is what this reports
            missing.append(f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    cli = subprocess.run([sys.executable, "-m", "posbench", "bench", "--dry-run", "--quiet", "--device", "cpu"],
                         capture_output=True, text=True)
    if cli.returncode != 0:
        missing.append(f"posbench bench --dry-run: exit {cli.returncode}: {' '.join(cli.stderr.split())[-300:]}")
    lines = [f"python {sys.version.split()[0]} at {sys.executable}"]
    try:
        import torch

        lines.append(f"torch {torch.__version__}, cuda {torch.version.cuda}, "
                     f"device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none (cpu)'}")
    except Exception:  # noqa: BLE001
        pass
    lines += [f"MISSING {line}" for line in missing] or ["every module imports"]
    out = Path(os.environ.get("OUT", "/tmp/posbench-gpu-out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "env.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if missing:
        print("error: the carried wheels are incomplete (run benchmarks/gpu/fetch_wheels.sh here and carry .whl)",
              file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
