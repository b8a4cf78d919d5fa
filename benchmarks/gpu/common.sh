#!/usr/bin/env bash
# The plumbing every GPU call script shares (benchmarks/gpu/run.sh, backends.sh): sourced after the script sets
# BUDGET and TITLE. It reads OUT, SIZE, DEVICE, PYTHON, WORK, WHEELS and SKIP from the environment, installs the
# carried wheels, checks that posbench imports (check_env.py: a missing module stops the call, naming it) and gives
# `phase` (a command within its limit and what is left of the budget, logged in $OUT/run.log) and `bench` (one
# `posbench bench` whose every cell is appended to $OUT/cells.jsonl the moment it finishes).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/posbench-gpu-out}
SIZE=${SIZE:-gpu}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/posbench-gpu-work}
WHEELS=${WHEELS:-.whl}      # the carried wheels (built for the GPU machine's python 3.12)
SKIP=" ${SKIP:-} "
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 OUT
LOG="$OUT/run.log"
START=$SECONDS

left() { echo $((BUDGET - (SECONDS - START))); }

phase() {  # name, most seconds, then the command: run within what is left of the budget
  local name=$1 most=$2 limit
  shift 2
  limit=$(left)
  (( limit > most )) && limit=$most
  if [[ "$SKIP" == *" ${name#* } "* ]]; then
    echo "$(date -u +%T) $name: skipped (SKIP)" >> "$LOG"
    return 0
  fi
  if (( limit < 15 )); then
    echo "$(date -u +%T) $name: skipped, $(left) s of the budget left" >> "$LOG"
    return 0
  fi
  echo "$(date -u +%T) $name: start, at most $limit s" >> "$LOG"
  timeout -k 5 "$limit" "$@"
  local code=$?
  echo "$(date -u +%T) $name: exit $code$( ((code == 124 || code == 137)) && echo ' (stopped at its limit)')" >> "$LOG"
}

bench() {  # name, most seconds, then posbench bench arguments (after the script's SHAPE)
  local name=$1 most=$2
  shift 2
  phase "bench $name" "$most" "$PY" -m posbench bench "${SHAPE[@]}" --device "$DEVICE" --quiet \
    --out "$WORK/$name" --cells-to "$OUT/cells.jsonl" "$@" >> "$LOG" 2>&1
}

echo "$(date -u +%T) $TITLE: SIZE=$SIZE DEVICE=$DEVICE BUDGET=${BUDGET}s" >> "$LOG"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || { echo "error: the carried wheels do not install" | tee -a "$LOG"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" benchmarks/gpu/check_env.py --device "$DEVICE" >> "$LOG" 2>&1 || { echo "environment: see env.txt" >> "$LOG"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/env.txt"
