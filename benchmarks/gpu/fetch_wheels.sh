#!/usr/bin/env bash
# Run HERE (the CPU machine, which reaches PyPI) before a device call: downloads into .whl/ the wheels that the
# lent H100's python3 (3.12, torch 2.11 + CUDA, numpy, safetensors, pandas, matplotlib already there) lacks for
# the GPU tests and `posbench bench`, plus x-transformers for the side-by-side numbers. .whl/ is git-ignored
# (.git/info/exclude) and travels with `carry: [".whl"]`; benchmarks/gpu/session.sh installs it there.
set -euo pipefail
cd "$(dirname "$0")/../.."
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
rm -rf .whl && mkdir -p .whl
PY=${PYTHON:-python3}
download() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$@"
}
# the CLI and its tables (typer's and rich's own needs included)
download typer==0.29.2 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 shellingham==1.5.4 \
  annotated-doc==0.0.7 pydantic==2.14.3 pydantic-core typing-inspection annotated-types
# x-transformers, for benchmarks/step_time.py's side-by-side numbers
download x-transformers einx einops loguru frozendict torch-einops-utils
du -sh .whl
ls .whl
