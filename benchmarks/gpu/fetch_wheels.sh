#!/usr/bin/env bash
# Run HERE (the CPU machine, which reaches PyPI) before a device call: downloads into .whl/ the wheels that the
# lent GPU machine's python3 (3.12, torch 2.11 + CUDA 13, numpy, safetensors, pandas, pytest already there) lacks
# or has at other versions, for `posbench bench` and `pytest -m gpu`. Every version is pinned to the one
# constraints.txt locks, as one consistent set: pydantic pins its pydantic-core exactly, so an unpinned
# pydantic-core (its newest release) makes pydantic refuse to import, and typer with it. .whl/ is git-ignored
# (.git/info/exclude) and travels with `carry: [".whl"]`; benchmarks/gpu/run.sh installs it there first and then
# checks that `import posbench.cli` works, naming what is missing. `--x-transformers` also fetches
# x-transformers for benchmarks/step_time.py's side-by-side numbers.
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
# the CLI and its tables: typer and rich, and everything they import, at the locked versions
download typer==0.29.2 click==8.5.1 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 \
  shellingham==1.5.4 annotated-doc==0.0.7 pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 \
  annotated-types==0.8.0 typing-extensions==4.16.0
# pytest-xdist: pyproject's addopts pass -n to every pytest (tests/conftest.py runs `-m gpu` in one process)
download pytest-xdist==3.8.0 execnet==2.1.2
if [[ "${1:-}" == "--x-transformers" ]]; then
  download x-transformers==2.31.10 einx einops loguru frozendict torch-einops-utils
fi
du -sh .whl
ls .whl
