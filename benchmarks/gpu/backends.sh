#!/usr/bin/env bash
# A second GPU call: which attention backend each logit-biased encoding should take on CUDA, measured. The first
# call on an H200 (2026-11-28) found `auto`'s SDPA choice for biases up to 2^26 scores slow for learned tables in
# bf16 (T5 8.8x and FIRE 11.6x RoPE at 16 x 1024; T5 75x at 1 x 2048, where flex took 1.4x): in bf16 SDPA's path
# for a float32 bias is posbench's query-block attention, written for the CPU. This times the others.
#
#   run(command="BUDGET=215 bash benchmarks/gpu/backends.sh", carry=[".whl"], timeout_s=240)
#
# Phases, each within its limit and what is left of BUDGET (a phase with under 15 s left is skipped):
#   1. fire-flex test    tests/test_gpu.py's bf16 FIRE-by-flex check against float64, with its traceback   <= 45 s
#   2. eager-1024        RoPE, T5, FIRE, KERPLE, ALiBi, Sandwich at 16 x 1024 with --attention eager      <= 50 s
#   3. flex-1024         T5, KERPLE, ALiBi, Sandwich at 16 x 1024 with --attention flex (FIRE: 38x on the H100) <= 60 s
#   4. eager/flex-4096   T5, FIRE, ALiBi at 1 x 4096 by each                                          <= 30 s each
# Everything comes back as benchmarks/gpu/run.sh's does: env.txt, run.log, tests.log, cells.jsonl (each cell the
# moment it finishes). SIZE=tiny DEVICE=cpu rehearses it on a CPU (sdpa in place of flex, which has no CPU backward).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/posbench-gpu-out}
SIZE=${SIZE:-gpu}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/posbench-gpu-work}
BUDGET=${BUDGET:-215}
WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 OUT
LOG="$OUT/run.log"
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
phase() {
  local name=$1 most=$2 limit
  shift 2
  limit=$(left)
  (( limit > most )) && limit=$most
  if (( limit < 15 )); then echo "$(date -u +%T) $name: skipped, $(left) s of the budget left" >> "$LOG"; return 0; fi
  echo "$(date -u +%T) $name: start, at most $limit s" >> "$LOG"
  timeout -k 5 "$limit" "$@"
  local code=$?
  echo "$(date -u +%T) $name: exit $code$( ((code == 124 || code == 137)) && echo ' (stopped at its limit)')" >> "$LOG"
}
echo "$(date -u +%T) posbench GPU backends call: SIZE=$SIZE DEVICE=$DEVICE BUDGET=${BUDGET}s" >> "$LOG"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || { echo "error: the carried wheels do not install" | tee -a "$LOG"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" benchmarks/gpu/check_env.py --device "$DEVICE" >> "$LOG" 2>&1 || { echo "environment: see env.txt" >> "$LOG"; exit 1; }

if [[ "$SIZE" == "tiny" ]]; then
  SHAPE=(--size small --threads 1 --steps 1 --warmup 1); SHORT=(--lengths 16 --batch 2); LONG=(--lengths 32 --batch 1)
  FLEX=sdpa; TEST=(-k "fire and eager")
else
  SHAPE=(--size paper --steps 5 --warmup 2); SHORT=(--lengths 1024 --batch 16); LONG=(--lengths 4096 --batch 1)
  FLEX=flex; TEST=(-k "fire-flex")
fi
bench() {
  local name=$1 most=$2
  shift 2
  phase "bench $name" "$most" "$PY" -m posbench bench "${SHAPE[@]}" --device "$DEVICE" --quiet \
    --out "$WORK/$name" --cells-to "$OUT/cells.jsonl" "$@" >> "$LOG" 2>&1
}
phase "tests fire-flex" 45 "$PY" -m pytest -v -p no:cacheprovider -m gpu --tb=long tests/test_gpu.py \
  "${TEST[@]}" >> "$OUT/tests.log" 2>&1
bench eager-1024 50 "${SHORT[@]}" -e t5,fire,kerple,alibi,sandwich --attention eager
bench "$FLEX-1024" 60 "${SHORT[@]}" -e t5,kerple,alibi,sandwich --attention "$FLEX"
bench eager-4096 30 "${LONG[@]}" -e t5,fire,alibi --attention eager
bench "$FLEX-4096" 30 "${LONG[@]}" -e t5,fire,alibi --attention "$FLEX"
echo "$(date -u +%T) done in $((SECONDS - START)) s: $(ls "$OUT" | tr '\n' ' ')" >> "$LOG"
