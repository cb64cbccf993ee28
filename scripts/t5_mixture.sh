#!/usr/bin/env bash
# Text-to-text multi-task fine-tuning of a tiny T5 with (IA)^3, LoRA, MoV and MoLoRA on a GLUE
# mixture (sst2, cola, mrpc), RTE and QNLI held out; prints a markdown table of trainable
# parameters, held-out median accuracy (rank classification) and dev loss.
# Usage: scripts/t5_mixture.sh [WORK_DIR] [STEPS]     (EMOE=path/to/emoe to choose the binary)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/runs/t5-mixture}
steps=${2:-300}
export EMOE=${EMOE:-$root/build/emoe}
shared=${SHARED:-$root/../shared}
mkdir -p "$work"
[ -f "$work/tiny-t5/model.safetensors" ] || "$root/scripts/make_tiny_t5.sh" "$work/tiny-t5" 200 >"$work/pretrain.log" 2>&1
for m in ia3 lora mov molora; do
  rm -rf "$work/$m"
  "$EMOE" train -c "$root/configs/t5-mixture-mov.yaml" --set model="$work/tiny-t5" --set method="$m" \
    --set data_dir="$shared/data" --set train.max_steps="$steps" --set train.max_train_examples=2000 \
    --set train.max_eval_examples=100 --set save_best=false --set output="$work/$m" >"$work/$m.log" 2>&1
done
echo "| method | trainable parameters | % of total | held-out (RTE, QNLI) mean median accuracy | dev loss |"
echo "|---|---:|---:|---:|---:|"
for m in ia3 lora mov molora; do
  python3 - "$work/$m/results.json" "$m" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p = r["parameters"]
print(f"| {sys.argv[2]} | {p['trainable']:,} | {p['trainable_percent']:.2f} | "
      f"{r.get('heldout_mean_median_accuracy', float('nan')):.2f} | {r.get('dev_loss', float('nan')):.4f} |")
PY
done
