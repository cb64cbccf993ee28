#!/usr/bin/env bash
# The analyses of issue 5 on a real run: stories260K (Llama architecture) fine-tuned on SST-2 as
# a sequence classifier, dense (full) vs EMoE vs GMoE, one seed. Writes docs/analysis/: the usage
# figures of `emoe analyze`, the pruning table of `emoe prune`, the efficiency table of
# `emoe bench`, and docs/analysis/README.md tying them together. About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
EMOE=${EMOE:-build/emoe}
RUNS=runs/analysis
OUT=docs/analysis
MODEL=../shared/models/stories260K/hf
common=(-c configs/stories260k-sst2-emoe.yaml --set train.max_train_examples=4000
        --set train.max_eval_examples=500 --set train.usage_interval=10 --set save_best=false)
for method in full emoe gmoe; do
  lr=1e-3
  if [ -f $RUNS/$method/results.json ]; then echo "reusing $RUNS/$method"; continue; fi
  rm -rf $RUNS/$method
  $EMOE train "${common[@]}" --set method=$method --set train.lr=$lr -o $RUNS/$method -q
done
mkdir -p $OUT
for method in emoe gmoe; do
  $EMOE analyze $RUNS/$method -o $OUT/$method -q
done
$EMOE prune $RUNS/emoe --max-examples 500 -q > /dev/null
cp $RUNS/emoe/prune.md $OUT/prune_emoe.md
$EMOE bench $MODEL --methods dense,lora,ia3,emoe,emoe-dispatched,gmoe,mov,molora --batch 16 --seq 64 --steps 5 \
  --json $OUT/efficiency.json -q > $OUT/efficiency.md
python3 - "$RUNS" "$OUT" <<'PY'
import json, sys, os
runs, out = sys.argv[1], sys.argv[2]
rows = []
for m in ["full", "emoe", "gmoe"]:
    r = json.load(open(f"{runs}/{m}/results.json"))
    best = r["best"]
    sets = [s for s in best if s != "dev"]
    rows.append((m, r["best_epoch"], best["dev"]["metrics"]["accuracy"],
                 sum(best[s]["metrics"]["accuracy"] for s in sets) / len(sets), sets, r["parameters"]))
with open(f"{out}/results.md", "w") as f:
    f.write("| method | parameters (trainable) | best epoch | dev accuracy | out-of-domain mean accuracy |\n|---|---|---|---|---|\n")
    for m, e, d, o, sets, p in rows:
        f.write(f"| {m} | {p['total']:,} ({p['trainable']:,}) | {e} | {d:.1f} | {o:.1f} |\n")
    f.write(f"\nOut-of-domain sets: {', '.join(rows[0][4])}.\n")
PY
echo "wrote $OUT"
