#!/usr/bin/env bash
# bf16 mixed precision against fp32 on a real task: full fine-tuning of bert-mini on SST-2,
# 200 steps of batch 16, the same seed and data order; prints the train loss over the last 50
# steps and the dev loss / accuracy of both, and the relative differences. bf16 matrix multiplies
# are slow on CPUs without AVX-512 BF16 (about 25 minutes here); the result is in
# docs/performance/bf16.md.
# Usage: scripts/bf16_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${STEPS:-200}
[[ -x "$build/emoe" ]] || { echo "bf16_check.sh: $build/emoe not built (run scripts/setup.sh)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in fp32 bf16-mixed; do
  "$build/emoe" -q train -c configs/bert-mini-sst2-full.yaml -o "$tmp/$p" --precision "$p" \
    --set train.max_steps="$steps" --set train.batch_size=16 --set train.max_train_examples=3200 \
    --set train.max_eval_examples=400 --set ood=[] --set train.log_every=50 --set save_best=false > /dev/null
done
python3 - "$tmp" "$steps" <<'PY'
import json, sys
def read(run):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
    train = [r for r in rows if r["type"] == "train"][-1]
    dev = [r for r in rows if r["type"] == "eval"][-1]["sets"]["dev"]
    return train["loss"], dev["loss"], dev["metrics"]["accuracy"]
a, b = read("fp32"), read("bf16-mixed")
print(f"| bert-mini SST-2, {sys.argv[2]} steps | train loss (last 50 steps) | dev loss | dev accuracy |")
print("|---|---|---|---|")
print(f"| fp32 | {a[0]:.6f} | {a[1]:.6f} | {a[2]:.2f} |")
print(f"| bf16-mixed | {b[0]:.6f} | {b[1]:.6f} | {b[2]:.2f} |")
print(f"| relative difference | {abs(b[0]-a[0])/a[0]*100:.3g} % | {abs(b[1]-a[1])/a[1]*100:.3g} % | |")
PY
