"""The first thing every GPU call runs: can this python run posbench? Imports each module the GPU scripts need and
runs the CLI's argument parsing (typer, with pydantic), names every one that fails and why, compiles one small
function with ``torch.compile`` on the device (``--device``, default cuda when there is one) and compares it with
eager, and writes all of it (torch, CUDA, the device) to ``$OUT/env.txt``. Exit code 1 if a module is missing (a
failed compile smoke test is reported, not fatal: the eager measurements still run)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

MODULES = ["torch", "numpy", "typer", "click", "rich", "pydantic", "pydantic_core", "annotated_types",
           "typing_inspection", "shellingham", "markdown_it", "pygments", "safetensors", "pytest", "xdist", "execnet",
           "posbench.cli", "posbench.model", "posbench.bench"]


def compile_smoke(device: str) -> str:
    """One line: a small compiled function against eager on ``device``."""
    try:
        import torch

        def fn(x):
            return torch.nn.functional.gelu(x @ x.T).sum(-1)

        x = torch.randn(64, 64, device=device)
        same = torch.allclose(torch.compile(fn)(x), fn(x), rtol=1e-4, atol=1e-4)
        return f"torch.compile smoke test on {device}: {'ok' if same else 'DIFFERS from eager'}"
    except Exception as exc:  # noqa: BLE001 - any failure is what this reports
        return f"torch.compile smoke test on {device}: FAILED {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def main() -> int:
    args = sys.argv[1:]
    device = args[args.index("--device") + 1] if "--device" in args else None
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
    if not missing:
        try:
            import torch

            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        except Exception:  # noqa: BLE001
            device = device or "cpu"
        lines.append(compile_smoke(device))
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
