#!/usr/bin/env bash
# One device call that does everything a GPU can show for issue 8, and writes the evidence under $OUT:
#   run(command="bash benchmarks/gpu/session.sh", carry=[".whl"], timeout_s=600)
# after `bash benchmarks/gpu/fetch_wheels.sh` here. It installs the carried wheels, runs `pytest -m gpu`, then
# `posbench bench` at the paper size (training 16 x 1024 and 1 x 8192, compiled training, decoding) and
# copies each result.json to $OUT (the device returns at most 8 files). Budget: about 8 minutes on an H100.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/posbench-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD
fi
LOG="$OUT/session.log"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c \
  "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } 2>&1 | tee "$LOG"

timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tail -n 60 | tee "$OUT/pytest-gpu.log"

bench() {  # name, then posbench bench arguments
  local name=$1; shift
  timeout 90 python3 -m posbench bench --size paper --device cuda --quiet --out /tmp/bench-"$name" "$@" \
    2>&1 | tee -a "$LOG"
  cp /tmp/bench-"$name"/bench/*/*/result.json "$OUT/bench-$name.json" 2>/dev/null || echo "no result: $name" >> "$LOG"
}
bench train-1024 --lengths 1024 --batch 16
bench train-8192 --lengths 8192 --batch 1 --steps 5 --warmup 2
bench compiled-1024 --lengths 1024 --batch 16 --compile
bench decode-1024 --mode decode --lengths 1024 --batch 1 --steps 5 --warmup 1
echo "done" | tee -a "$LOG"
