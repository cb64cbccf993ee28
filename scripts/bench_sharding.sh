#!/usr/bin/env bash
# Sharded data parallel on this machine: peak CPU tensor memory per rank and training speed of
# `emoe train --nproc N` at train.sharding none / optimizer / gradients / full, on a generated
# Llama-shaped model (fresh weights from `emoe pretrain`, one step), fp32 AdamW, full
# fine-tuning and EMoE. Prints a markdown table with the ratios to `none` measured in this one
# run (no assertion; these machines are noisy).
# Usage: scripts/bench_sharding.sh [BUILD_DIR]
#   SIZE=300m (default): hidden 1024, 22 layers, FFN 2816 — about 280 M parameters (needs ~12 GiB)
#   SIZE=tiny: hidden 64, 2 layers (the test's short configuration of the same path)
#   LEVELS="optimizer gradients full" (the sharded levels run), STEPS=4 optimiser steps per run, WORLD=2 ranks for the sharded levels, NONE_WORLD=WORLD ranks
#   for the unsharded baseline (its per-rank memory does not depend on the world size but for the
#   per-rank batch: NONE_WORLD=2 with WORLD=4 keeps 4 whole copies of the model off a 24 GiB box)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
size=${SIZE:-300m}
steps=${STEPS:-4}
world=${WORLD:-2}
none_world=${NONE_WORLD:-$world}
levels=${LEVELS:-optimizer gradients full}  # the sharded levels measured (none always)
[[ -x "$build/emoe" ]] || { echo "bench_sharding.sh: $build/emoe not built (run scripts/setup.sh)" >&2; exit 2; }
for need in models/stories260K/hf data/glue/SST-2 data/corpus/tinystories; do
  if [[ ! -e ../shared/$need ]]; then
    echo "bench_sharding.sh: ../shared/$need not found" >&2
    [[ ${CI:-} == true ]] && exit 2  # under CI a missing ../shared is a failure
    exit 77                          # elsewhere: skipped
  fi
done
case "$size" in
  300m) shape=(--set hidden=1024 --set layers=22 --set heads=16 --set kv_heads=16 --set intermediate=2816) ;;
  tiny) shape=(--set hidden=64 --set layers=2 --set heads=4 --set kv_heads=4 --set intermediate=256) ;;
  *) echo "bench_sharding.sh: SIZE: expected 300m or tiny, got '$size'" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
corpus=$(ls ../shared/data/corpus/tinystories/*.txt | head -1)
# one pretraining step: a model folder of the shape with its tokenizer (stories260K's)
"$build/emoe" -q pretrain --set arch=llama "${shape[@]}" --set max_positions=64 \
  --set tokenizer=../shared/models/stories260K/hf --corpus "$corpus" --set steps=1 \
  --set batch_size=2 --set max_length=16 -o "$tmp/model" > /dev/null
params=$(python3 - "$tmp/model" <<'PY'
import json, struct, sys, glob
n = 0
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(f, "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    for k, v in h.items():
        if k != "__metadata__":
            c = 1
            for d in v["shape"]: c *= d
            n += c
print(f"{n / 1e6:.1f} M")
PY
)
run() {  # method level ranks
  local out="$tmp/$1-$2" moe=()
  [[ $1 == emoe ]] && moe=(--set moe.experts=4 --set moe.topk=1 --set moe.kmeans.restarts=1 --set moe.sample_tokens=256)
  "$build/emoe" -q train --set model="$tmp/model" --set task=sst2 --set data_dir=../shared/data \
    --set method="$1" --set ood=[] --set train.batch_size=4 --set train.max_steps="$steps" \
    --set train.max_length=32 --set train.max_train_examples=64 --set train.max_eval_examples=8 \
    --set train.log_every=1 "${moe[@]}" --set save_best=false --set threads=1 --nproc "$3" \
    --sharding "$2" -o "$out" > /dev/null
  python3 - "$out" <<'PY'
import json, sys
run = sys.argv[1]
mem = json.load(open(run + "/results.json"))["memory"]
rows = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"train"' in l]
rows = rows[1:] or rows  # the first step's window holds start-up
print(max(mem["peak_tensor_mib_per_rank"]), max(mem["optimizer_state_mib_per_rank"]),
      sum(r["tokens_per_s"] for r in rows) / len(rows))
PY
}
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "Sharded data parallel, $world ranks x 1 thread (none: $none_world) (c10d Gloo, loopback), generated Llama-shaped model ($params parameters, fp32, AdamW), batch 4 x 32 tokens, $steps steps; $cpu, $(date -u +%Y-%m-%d)"
echo
echo "| method | train.sharding | ranks | peak tensor memory per rank (MiB) | ratio to none | AdamW state per rank (MiB) | tokens/s | speed ratio to none |"
echo "|---|---|---|---|---|---|---|---|"
for method in full emoe; do
  read -r base_mem base_state base_tps < <(run "$method" none "$none_world")
  for level in none $levels; do
    if [[ $level == none ]]; then m=$base_mem s=$base_state t=$base_tps n=$none_world
    else read -r m s t < <(run "$method" "$level" "$world"); n=$world; fi
    python3 -c "import sys; m,s,t,bm,bt=map(float,sys.argv[4:]); print(f'| {sys.argv[1]} | {sys.argv[2]} | {sys.argv[3]} | {m:.1f} | {m/bm:.2f} | {s:.1f} | {t:.0f} | {t/bt:.2f} |')" \
      "$method" "$level" "$n" "$m" "$s" "$t" "$base_mem" "$base_tps"
  done
done
