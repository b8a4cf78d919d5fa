#!/usr/bin/env bash
# The GPU measurements of issue 23, as three device calls of at most 540 s each (a fourth, per encoding, for the
# arithmetic gpu preset). Here first: `bash benchmarks/gpu/fetch_wheels.sh`. Then one device call per part:
#   run(command="bash benchmarks/gpu/run.sh tests",    carry=[".whl"], timeout_s=600)   # pytest -m gpu
#   run(command="bash benchmarks/gpu/run.sh train",    carry=[".whl"], timeout_s=600)   # 16 x 1024, 1 x 8192
#   run(command="bash benchmarks/gpu/run.sh compiled", carry=[".whl"], timeout_s=600)   # compiled; decoding
#   run(command="bash benchmarks/gpu/run.sh arithmetic rope", carry=[".whl"], timeout_s=600)   # then tape
# Every part first installs the carried wheels and checks that posbench imports (benchmarks/gpu/check_env.py,
# which names what is missing), and stops there if not. Every bench cell is written to its run's cells.jsonl as
# it finishes, and each bench's cells (result.json once it ends) are copied to $OUT right after it, whether it
# ended or was stopped by its timeout; pytest runs verbose into $OUT/pytest-gpu.log, one line per test as it
# finishes. At most 8 files come back per call: each part writes 6 or fewer.
# SIZE=tiny DEVICE=cpu runs the same commands on a CPU with a tiny model in seconds (tests/test_gpu_scripts.py;
# there only the compiled training bench times all 13 encodings, the others three).
set -uo pipefail
cd "$(dirname "$0")/../.."
PART=${1:?usage: run.sh tests|train|compiled|arithmetic ENCODING}
OUT=${OUT:-/tmp/posbench-gpu-out}
SIZE=${SIZE:-gpu}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/posbench-gpu-work}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
LOG="$OUT/$PART.log"

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: the carried wheels do not install" | tee "$LOG"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" benchmarks/gpu/check_env.py 2>&1 | tee "$LOG" || exit 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$LOG"

if [[ "$SIZE" == "tiny" ]]; then     # the plumbing, on a CPU in seconds
  SHAPE=(--size small --threads 1 --steps 1 --warmup 1)
  L1=(--lengths 16 --batch 2); L2=(--lengths 32 --batch 1); DEC=(--lengths 16 --batch 1 --new-tokens 4)
  COMPILE=(--compile --compile-backend eager); BIG_TIMEOUT=120; SMALL_TIMEOUT=60
  SOME=(-e alibi,cope,tape)          # the compiled training bench still times all 13 in one process
else
  SHAPE=(--size paper)
  L1=(--lengths 1024 --batch 16); L2=(--lengths 8192 --batch 1 --steps 5 --warmup 2)
  DEC=(--lengths 1024 --batch 1 --steps 5 --warmup 1); COMPILE=(--compile); BIG_TIMEOUT=240; SMALL_TIMEOUT=110
  SOME=()
fi

bench() {  # name, seconds, then posbench bench arguments: the cells go to $OUT/bench-<name>.json(l) at once
  local name=$1 seconds=$2; shift 2
  rm -rf "$WORK/$name"
  timeout "$seconds" "$PY" -m posbench bench "${SHAPE[@]}" --device "$DEVICE" --quiet --out "$WORK/$name" "$@" \
    >> "$LOG" 2>&1
  echo "bench $name: exit $?" | tee -a "$LOG"
  local run
  run=$(ls -d "$WORK/$name"/bench/*/*/ 2>/dev/null | head -n 1)
  if [[ -f "$run/result.json" ]]; then cp "$run/result.json" "$OUT/bench-$name.json"
  elif [[ -f "$run/cells.jsonl" ]]; then cp "$run/cells.jsonl" "$OUT/bench-$name.jsonl"
  else echo "bench $name: no cell finished" | tee -a "$LOG"; fi
}

case "$PART" in
  tests)
    timeout 500 "$PY" -m pytest -v -m gpu tests/test_gpu.py -p no:cacheprovider > "$OUT/pytest-gpu.log" 2>&1
    code=$?
    tail -n 25 "$OUT/pytest-gpu.log"
    echo "pytest -m gpu: exit $code" | tee -a "$LOG" ;;
  train)
    bench train-short "$BIG_TIMEOUT" "${L1[@]}" "${SOME[@]}"
    bench train-long "$BIG_TIMEOUT" "${L2[@]}" "${SOME[@]}" ;;
  compiled)
    bench compiled-short $((BIG_TIMEOUT + 40)) "${L1[@]}" "${COMPILE[@]}"
    bench decode "$SMALL_TIMEOUT" --mode decode "${DEC[@]}" "${SOME[@]}"
    bench decode-compiled $((SMALL_TIMEOUT + 20)) --mode decode "${DEC[@]}" "${COMPILE[@]}" "${SOME[@]}" ;;
  arithmetic)
    ENCODING=${2:?usage: run.sh arithmetic ENCODING}
    rm -rf "$WORK/arithmetic"
    if [[ "$SIZE" == "tiny" ]]; then PRESET=(--preset tiny --set train.steps=2 --set task.eval_samples=2); else PRESET=(--preset gpu); fi
    timeout 500 "$PY" -m posbench run -e "$ENCODING" -t arithmetic "${PRESET[@]}" --device "$DEVICE" --quiet \
      --out "$WORK/arithmetic" >> "$LOG" 2>&1
    echo "arithmetic $ENCODING: exit $?" | tee -a "$LOG"
    cp "$(ls "$WORK"/arithmetic/arithmetic/*/*/result.json 2>/dev/null | head -n 1)" "$OUT/arithmetic-$ENCODING.json" \
      2>/dev/null || echo "arithmetic $ENCODING: no result" | tee -a "$LOG" ;;
  *) echo "error: unknown part '$PART' (tests, train, compiled, arithmetic ENCODING)" >&2; exit 2 ;;
esac
echo "done: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
