#!/usr/bin/env bash
# A second GPU call: which attention backend each logit-biased encoding should take on CUDA, measured. The first
# call on an H200 (2026-11-28) found `auto`'s SDPA choice for biases up to 2^26 scores slow for learned tables in
# bf16 (T5 8.8x and FIRE 11.6x RoPE at 16 x 1024; T5 75x at 1 x 2048, where flex took 1.4x): in bf16 SDPA's path
# for a float32 bias is posbench's query-block attention, written for the CPU. This times the others. (The T5
# cause, found afterwards on the CPU, is fixed: every relative bias had gone element-wise on a GPU; docs/speed.md.)
#
#   run(command="bash benchmarks/gpu/backends.sh", carry=[".whl"], timeout_s=230)
#
# Phases, each within its limit and what is left of BUDGET (a phase with under 15 s left is skipped):
#   1. fire-flex test    tests/model/test_gpu.py's bf16 FIRE-by-flex check against float64, with its traceback   <= 45 s
#   2. eager-1024        RoPE, T5, FIRE, KERPLE, ALiBi, Sandwich at 16 x 1024 with --attention eager      <= 50 s
#   3. flex-1024         T5, KERPLE, ALiBi, Sandwich at 16 x 1024 with --attention flex (FIRE: 38x on the H100) <= 60 s
#   4. eager/flex-4096   T5, FIRE, ALiBi at 1 x 4096 by each                                          <= 30 s each
# Everything comes back as benchmarks/gpu/run.sh's does: env.txt, run.log, tests.log, cells.jsonl (each cell the
# moment it finishes). SIZE=tiny DEVICE=cpu rehearses it on a CPU (sdpa in place of flex, which has no CPU backward).
BUDGET=${BUDGET:-205}
TITLE="posbench GPU backends call"
source "$(dirname "$0")/common.sh"

if [[ "$SIZE" == "tiny" ]]; then
  SHAPE=(--size small --threads 1 --timed-steps 1 --warmup 1); SHORT=(--lengths 16 --batch 2); LONG=(--lengths 32 --batch 1)
  FLEX=sdpa; TEST=(-k "fire and eager")
else
  SHAPE=(--size paper --timed-steps 5 --warmup 2); SHORT=(--lengths 1024 --batch 16); LONG=(--lengths 4096 --batch 1)
  FLEX=flex; TEST=(-k "fire-flex")
fi
phase "tests fire-flex" 45 "$PY" -m pytest -v -p no:cacheprovider -m gpu --tb=long tests/model/test_gpu.py \
  "${TEST[@]}" >> "$OUT/tests.log" 2>&1
bench eager-1024 50 "${SHORT[@]}" -e t5,fire,kerple,alibi,sandwich --attention eager
bench "$FLEX-1024" 60 "${SHORT[@]}" -e t5,kerple,alibi,sandwich --attention "$FLEX"
bench eager-4096 30 "${LONG[@]}" -e t5,fire,alibi --attention eager
bench "$FLEX-4096" 30 "${LONG[@]}" -e t5,fire,alibi --attention "$FLEX"
echo "$(date -u +%T) done in $((SECONDS - START)) s: $(ls "$OUT" | tr '\n' ' ')" >> "$LOG"
