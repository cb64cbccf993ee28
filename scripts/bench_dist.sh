#!/usr/bin/env bash
# Data-parallel throughput on this machine: `emoe train` on bert-mini / SST-2 with the same
# global batch as 1 process x 2 threads and as 2 processes x 1 thread (c10d Gloo on loopback).
# Prints a markdown table with the ratio (measured in this one run; no assertion).
# Usage: scripts/bench_dist.sh [BUILD_DIR]   (STEPS=60 BATCH=32 by default; about 2 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${STEPS:-60}
batch=${BATCH:-32}
[[ -x "$build/emoe" ]] || { echo "bench_dist.sh: $build/emoe not built (run scripts/setup.sh)" >&2; exit 2; }
[[ -d ../shared/models/bert-mini ]] || { echo "bench_dist.sh: ../shared/models/bert-mini not found" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log_every=$(( steps / 6 > 0 ? steps / 6 : 1 ))
run() {  # name threads extra-args...
  local name=$1 threads=$2; shift 2
  "$build/emoe" -q train --set model=../shared/models/bert-mini --set task=sst2 --set data_dir=../shared/data \
    --set method=full --set ood=[] --set train.batch_size="$batch" --set train.max_steps="$steps" \
    --set train.max_length=64 --set train.max_eval_examples=64 --set train.log_every="$log_every" \
    --set save_best=false --set threads="$threads" -o "$tmp/$name" "$@" > /dev/null
  # tokens/s over the logged windows after the first (start-up excluded)
  python3 - "$tmp/$name/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
rows = rows[1:] or rows
print(sum(r["tokens_per_s"] for r in rows) / len(rows))
PY
}
one=$(run one 2)
two=$(run two 1 --nproc 2)
echo "| configuration (bert-mini, SST-2, global batch $batch x <=64 tokens, $steps steps) | tokens/s |"
echo "|---|---|"
printf '| 1 process x 2 threads | %.0f |\n' "$one"
printf '| 2 processes x 1 thread (c10d Gloo, loopback) | %.0f |\n' "$two"
python3 -c "import sys; print(f'| ratio 2 x 1 / 1 x 2 | {float(sys.argv[2]) / float(sys.argv[1]):.2f} |')" "$one" "$two"
