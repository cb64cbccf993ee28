#!/usr/bin/env bash
# The data-ratio experiment of the EMoE paper: full fine-tuning vs EMoE trained on 10, 25, 50 and
# 100 % of one training pool (nested fixed subsets: train.max_train_examples keeps a fixed random
# subset), same dev set, seeds 0,1,2 — `emoe sweep` over train.max_train_examples. Prints the
# sweep's mean ± std table (population std, as the authors' tables); OUT/sweep.md and
# OUT/sweep.json keep it.
# Usage: scripts/data_ratio.sh [BUILD_DIR]   (POOL=4000 SEEDS=0,1,2 CONFIG=... OUT=runs/data-ratio)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
pool=${POOL:-4000}
seeds=${SEEDS:-0,1,2}
config=${CONFIG:-configs/bert-mini-sst2-emoe.yaml}
out=${OUT:-runs/data-ratio}
[[ -x "$build/emoe" ]] || { echo "data_ratio.sh: $build/emoe not built (run scripts/setup.sh)" >&2; exit 2; }
sizes=$(python3 -c "import sys; p=int(sys.argv[1]); print(','.join(str(max(1, round(p * r))) for r in (0.1, 0.25, 0.5, 1.0)))" "$pool")
echo "data ratio: $config, methods full and emoe, training examples $sizes (10/25/50/100 % of $pool), seeds $seeds"
"$build/emoe" sweep -c "$config" --methods full,emoe --seeds "$seeds" \
  --grid train.max_train_examples="$sizes" --set 'ood=[]' -o "$out"
# every grid point (the sweep's own table keeps the best point per method): mean ± population std
python3 - "$out/sweep.json" <<'PY'
import json, math, sys
from collections import defaultdict
runs = json.load(open(sys.argv[1]))
acc = defaultdict(list)
for r in runs:
    n = int(r["point"][0].split("=")[1])
    acc[(r["method"], n)].append(r["results"]["dev"]["metrics"]["accuracy"])
sizes = sorted({n for _, n in acc})
methods = [m for m in ("full", "emoe") if any(k[0] == m for k in acc)]
def cell(v):
    mu = sum(v) / len(v)
    return f"{mu:.2f} ± {math.sqrt(sum((x - mu) ** 2 for x in v) / len(v)):.2f}"
print()
print("| method | " + " | ".join(f"{n} ({100 * n / sizes[-1]:.0f} %)" for n in sizes) + " |")
print("|---|" + "---|" * len(sizes))
for m in methods:
    print(f"| {m} | " + " | ".join(cell(acc[(m, n)]) for n in sizes) + " |")
print("| emoe − full | " + " | ".join(
    f"{sum(acc[('emoe', n)]) / len(acc[('emoe', n)]) - sum(acc[('full', n)]) / len(acc[('full', n)]):+.2f}"
    for n in sizes) + " |")
PY
