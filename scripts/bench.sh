#!/usr/bin/env bash
# Runs every benchmark program and writes docs/performance/{gemm,train,ffn,generate,rows,dist,
# eager}.md + train.json.
# Usage: scripts/bench.sh [BUILD_DIR]   (default build/; takes about 20 minutes on 2 cores)
# Quick check of the same code path: QUICK=1 scripts/bench.sh (tiny shapes, a minute; bench_eager's
# quick run is the test Bench.EagerQuick).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=docs/performance
for b in bench_gemm bench_train bench_ffn bench_generate bench_rows bench_eager; do
  [[ -x "$build/bench/$b" ]] || { echo "bench.sh: $build/bench/$b not built (run scripts/setup.sh)" >&2; exit 2; }
done
mkdir -p "$out"
if [[ "${QUICK:-0}" == 1 ]]; then
  out=$(mktemp -d)
  "$build/bench/bench_gemm" --seconds 0.2 > "$out/gemm.md"
  "$build/bench/bench_train" --layers 1 --batch 2 --seq 32 --steps 1 --warmup 1 --peak-seconds 0.05 --methods full,lora,emoe,emoe-dispatched,gmoe,mov \
    --json "$out/train.json" --markdown "$out/train.md" > /dev/null
  "$build/bench/bench_ffn" --tokens 128 --reps 1 > "$out/ffn.md"
  "$build/bench/bench_ffn" --tokens 128 --reps 1 --precision bf16 >> "$out/ffn.md"
  "$build/bench/bench_generate" --layers 1 --prompt 8 --new 4 --reps 1 --batches 1,2 > "$out/generate.md"
  "$build/bench/bench_rows" --rows 64 --vocab 512 --hidden 64 --seconds 1 > "$out/rows.md"
  STEPS=4 BATCH=8 scripts/bench_dist.sh "$build" > "$out/dist.md"
  cat "$out/gemm.md" "$out/train.md" "$out/ffn.md" "$out/generate.md" "$out/rows.md" "$out/dist.md"
  exit 0
fi
"$build/bench/bench_gemm" | tee "$out/gemm.md"
"$build/bench/bench_train" --steps 3 --json "$out/train.json" --markdown "$out/train.md"
{ "$build/bench/bench_ffn" --tokens 2048 --reps 5 && echo &&
  "$build/bench/bench_ffn" --tokens 2048 --reps 5 --precision bf16; } | tee "$out/ffn.md"
"$build/bench/bench_generate" | tee "$out/generate.md"
"$build/bench/bench_rows" | tee "$out/rows.md"
scripts/bench_dist.sh "$build" | tee "$out/dist.md"
"$build/bench/bench_eager" | tee "$out/eager.md"
