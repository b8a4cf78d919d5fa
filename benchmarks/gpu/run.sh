#!/usr/bin/env bash
# Fifteen minutes of GPU, one call (issue 35): the most valuable measurements first, the whole call within
# BUDGET seconds (560), every result written under $OUT the moment it exists, so that a kill at any minute
# leaves everything finished so far. Here first: `bash benchmarks/gpu/fetch_wheels.sh`. Then:
#
#   run(command="bash benchmarks/gpu/run.sh", carry=[".whl"], timeout_s=600)
#
# The plan, in the order of what is least known (each phase stops at its own limit, or earlier when the budget
# runs out; a phase with under 15 s left is skipped and says so):
#    1. environment       the carried wheels installed, every module imports, a torch.compile smoke test (~40 s)
#    2. arithmetic rope   the GPU study's cell (preset gpu, compiled as `auto` does on CUDA) for 400 steps and
#                         its whole evaluation: the step time after compilation, the compile and evaluation
#                         times, so that the study's expected time is measured, not estimated         <= 90 s
#    3. first tests       tests/model/test_gpu_first.py: CUDA-graph capture, compiled Triton FlexAttention forward/
#                         backward with posbench's kernel options, flash-attn, the CUDA-event timer, TF32  <= 60 s
#    4. arithmetic tape   the same for TAPE (compiled TAPE on CUDA had not run)                        <= 100 s
#    5. other tests       pytest -m gpu tests/model/test_gpu.py (backends, compiled models, decoding, padding),
#                         each test at most 30 s where pytest-timeout is installed                    <= 60 s
#    6. train speed       every encoding at the paper size (12 x 768), 16 x 1024, eager                <= 70 s
#    7. sdpa vs flex      T5, FIRE, ALiBi at 1 x 2048 and 1 x 4096 by each backend: where auto's threshold
#                         (SDPA_BIAS_MAX_SCORES) should be                                        <= 30 s each
#    8. memory at 8k      every encoding, 1 x 8192 tokens, peak GiB                                    <= 40 s
#    9. decoding          ms per new token after a 1,024-token prompt, every encoding                  <= 25 s
#   10. arithmetic paper  RoPE at the TAPE paper's arithmetic size (16 x 1024), 150 steps and a twentieth of
#                         the evaluation, if time is left                                             <= 120 s
# Encodings run in the order of what is least known: RoPE (the baseline), TAPE, the biased ones, the rest, any
# encoding registered since (a plugin too), and CoPE and DAPE (which run out of memory at the paper's size) last
# (benchmarks/gpu/encoding_order.py).
# What comes back ($OUT, 5 files; at most 8 may):
#   env.txt         python, torch, CUDA, the device; what does not import; the compile smoke test
#   run.log         each phase's start, limit and exit, and the benches' and runs' output
#   tests.log       pytest -v, one line per test as it finishes (first tests, then the others)
#   cells.jsonl     every bench cell, one JSON line, appended the moment it finishes (`posbench bench --cells-to`)
#   arithmetic.tar  each arithmetic run's result.json, config.json and train_log.csv (one row per 50 steps with
#                   its cumulative tokens/s, so the time of every step after compilation can be read off), remade
#                   after each arithmetic phase, a stopped one too
# A second call on what is left of the 15 minutes: BUDGET (seconds), ENCODINGS (comma list, in the order wanted),
# FIRST (the first tests' pytest arguments) and SKIP (phase names: "others", "train-1024", "sdpa-mid", "flex-mid",
# "memory-8k", "decode", "gpu-rope", "gpu-tape", "paper-rope").
# SIZE=tiny DEVICE=cpu runs the same plan on a CPU with a tiny model in about a minute (tests/bench/test_gpu_scripts.py).
BUDGET=${BUDGET:-560}
TITLE="posbench GPU call"
FIRST=${FIRST:-tests/model/test_gpu_first.py}
eval "FIRST_ARGS=($FIRST)"
source "$(dirname "$0")/common.sh"

if [[ "$SIZE" == "tiny" ]]; then     # the plan's plumbing on a CPU
  SHAPE=(--size small --threads 1 --timed-steps 1 --warmup 1)
  SHORT=(--lengths 16 --batch 2); LONG=(--lengths 32 --batch 1); DECODE=(--lengths 16 --batch 1 --new-tokens 4)
  ONLY=(--only alibi,cope,tape)
  CROSS=(--lengths 24 --batch 1 -e alibi); VERSUS=(sdpa eager)
  ARITH=(-p tiny --steps 20 --set train.log_every=5); PAPER=(-p tiny --steps 10 --set train.log_every=5)
else
  SHAPE=(--size paper --timed-steps 5 --warmup 2)
  SHORT=(--lengths 1024 --batch 16); LONG=(--lengths 8192 --batch 1); DECODE=(--lengths 1024 --batch 1)
  ONLY=()                                    # every registered encoding, plugins included
  CROSS=(--lengths 2048,4096 --batch 1,1 -e t5,fire,alibi); VERSUS=(sdpa flex)
  ARITH=(-p gpu --steps 400 --set train.log_every=50)
  PAPER=(-p paper --steps 150 --set train.log_every=25 --set task.eval_samples=5)
fi
if ORDER=$("$PY" benchmarks/gpu/encoding_order.py "${ONLY[@]}" 2>> "$LOG"); then
  SOME=(-e "$ORDER")
else                                       # bench's own default then: every encoding, sorted by name
  echo "$(date -u +%T) encoding order: failed (above); the benches take every encoding by name" >> "$LOG"
  SOME=()
fi
[[ -n "${ENCODINGS:-}" ]] && SOME=(-e "$ENCODINGS")

tests() {  # name, most seconds, then pytest arguments: -v, one line per test into $OUT/tests.log as it finishes
  local name=$1 most=$2
  shift 2
  phase "tests $name" "$most" "$PY" -m pytest -v -p no:cacheprovider -m gpu "$@" >> "$OUT/tests.log" 2>&1
}

arithmetic() {  # name, most seconds, then posbench run arguments: one arithmetic run, its small files to $OUT
  local name=$1 most=$2
  shift 2
  phase "arithmetic $name" "$most" "$PY" -m posbench run -t arithmetic --device "$DEVICE" --log csv \
    --out "$WORK/arithmetic" "$@" >> "$LOG" 2>&1
  [[ -d "$WORK/arithmetic" ]] || return 0
  (cd "$WORK" && find arithmetic \( -name result.json -o -name config.json -o -name train_log.csv \) -print0 \
    | tar -cf "$OUT/.arithmetic.tar" --null -T - && mv "$OUT/.arithmetic.tar" "$OUT/arithmetic.tar") 2>> "$LOG"
}

TIMEOUT=()     # each GPU test at most 30 s, where pytest-timeout is installed (a slow compile stops one test)
"$PY" -c "import pytest_timeout" 2>/dev/null && TIMEOUT=(--timeout 30)

arithmetic gpu-rope 90 -e rope "${ARITH[@]}"
tests first 60 "${FIRST_ARGS[@]}"
arithmetic gpu-tape 100 -e tape "${ARITH[@]}"
tests others 60 "${TIMEOUT[@]}" tests/model/test_gpu.py
bench train-1024 70 "${SHORT[@]}" "${SOME[@]}"
bench "${VERSUS[0]}-mid" 30 "${CROSS[@]}" --attention "${VERSUS[0]}"
bench "${VERSUS[1]}-mid" 30 "${CROSS[@]}" --attention "${VERSUS[1]}"
bench memory-8k 40 "${LONG[@]}" "${SOME[@]}"
bench decode 25 --mode decode "${DECODE[@]}" "${SOME[@]}"
arithmetic paper-rope 120 -e rope "${PAPER[@]}"
echo "$(date -u +%T) done in $((SECONDS - START)) s: $(ls "$OUT" | tr '\n' ' ')" >> "$LOG"
