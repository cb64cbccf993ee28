#!/usr/bin/env bash
# The k/N grid of the EMoE paper: EMoE's dev score over the number of experts N and the number
# chosen per token k — `emoe sweep` over moe.experts x moe.topk, seeds averaged. The sweep writes
# OUT/sweep.md (the best point, then one table per evaluation set: rows N, columns k, mean ±
# population std over seeds) and OUT/emoe/grid.png (the same as heatmaps); this script prints the
# dev table with k/N beside each cell and the dense baseline (method full, same seeds).
# Usage: scripts/kn_grid.sh [BUILD_DIR]
#   EXPERTS=4,8,16,32 TOPK=1,2,4 SEEDS=0,1 POOL=1000 CONFIG=configs/bert-mini-sst2-emoe.yaml
#   OUT=runs/kn-grid SETS="key=value ..." (more --set for every run; the test's short
#   configuration: EXPERTS=2,4 TOPK=1,2 SEEDS=0 POOL=32 SETS="train.epochs=1 train.max_eval_examples=32")
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
experts=${EXPERTS:-4,8,16,32}
topk=${TOPK:-1,2,4}
seeds=${SEEDS:-0,1}
pool=${POOL:-1000}
config=${CONFIG:-configs/bert-mini-sst2-emoe.yaml}
out=${OUT:-runs/kn-grid}
extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done
[[ -x "$build/emoe" ]] || { echo "kn_grid.sh: $build/emoe not built (run scripts/setup.sh)" >&2; exit 2; }
for need in models/bert-mini data/glue/SST-2; do
  if [[ ! -e ../shared/$need ]]; then
    echo "kn_grid.sh: ../shared/$need not found" >&2
    [[ ${CI:-} == true ]] && exit 2  # under CI a missing ../shared is a failure
    exit 77                          # elsewhere: skipped
  fi
done
mkdir -p "$(dirname "$out")"
echo "k/N grid: $config, N in {$experts}, k in {$topk}, seeds $seeds, $pool training examples (logs: $out-emoe.log, $out-full.log)"
"$build/emoe" sweep -c "$config" --methods emoe --seeds "$seeds" --grid moe.experts="$experts" \
  --grid moe.topk="$topk" --set 'ood=[]' --set train.max_train_examples="$pool" \
  --set save_best=false "${extra[@]}" -o "$out/emoe" > /dev/null 2> "$out-emoe.log"
"$build/emoe" sweep -c "$config" --methods full --seeds "$seeds" \
  --set 'ood=[]' --set train.max_train_examples="$pool" --set save_best=false "${extra[@]}" \
  -o "$out/full" > /dev/null 2> "$out-full.log"
python3 - "$out" <<'PY'
import json, math, sys
from collections import defaultdict
out = sys.argv[1]
def stats(v):
    mu = sum(v) / len(v)
    return mu, math.sqrt(sum((x - mu) ** 2 for x in v) / len(v))
acc = defaultdict(list)
for r in json.load(open(out + "/emoe/sweep.json")):
    p = dict(kv.split("=") for kv in r["point"])
    acc[(int(p["moe.experts"]), int(p["moe.topk"]))].append(r["results"]["dev"]["metrics"]["accuracy"])
dense = [r["results"]["dev"]["metrics"]["accuracy"] for r in json.load(open(out + "/full/sweep.json"))]
ns = sorted({n for n, _ in acc}); ks = sorted({k for _, k in acc})
d_mu, d_sd = stats(dense)
print()
print(f"dev accuracy (%), mean ± population std over {len(dense)} seeds; dense (full) {d_mu:.2f} ± {d_sd:.2f}")
print()
print("| N \\ k | " + " | ".join(str(k) for k in ks) + " |")
print("|---|" + "---|" * len(ks))
for n in ns:
    cells = []
    for k in ks:
        if (n, k) not in acc:
            cells.append("-")
            continue
        mu, sd = stats(acc[(n, k)])
        cells.append(f"{mu:.2f} ± {sd:.2f} (k/N {k}/{n}, {mu - d_mu:+.2f})")
    print(f"| {n} | " + " | ".join(cells) + " |")
print()
print(f"heatmap: {out}/emoe/emoe/grid.png")
PY
