#!/usr/bin/env bash
# Tokenizer throughput, emoe against Hugging Face's Rust `tokenizers` on the same 10 MB of mixed
# text (corpora, instructions, the fixtures' code/CJK/emoji/RTL texts), one thread each, in one
# run; checks that both produce the same ids. Needs `npm` (installs the `tokenizers` package
# into $EMOE_NPM_DIR, default /tmp/emoe-npm) and a built tree (build/bench/bench_tokenizer).
# Usage: scripts/bench_tokenizer.sh [TOKENIZER_DIR] [MEGABYTES]   (default ../shared/tokenizers/llama3, 10)
set -euo pipefail
cd "$(dirname "$0")/.."
TOK=${1:-../shared/tokenizers/llama3}
MB=${2:-10}
NPM_DIR=${EMOE_NPM_DIR:-/tmp/emoe-npm}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ ! -d "$NPM_DIR/node_modules/tokenizers" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent tokenizers@0.23.2 >/dev/null)
fi

python3 - "$MB" "$WORK/chunks.jsonl" <<'PY'
import json, pathlib, sys
target = int(float(sys.argv[1]) * 1e6)
shared = pathlib.Path("../shared")
docs = []
for p in sorted((shared / "data/corpus").rglob("*")):
    if p.suffix == ".jsonl":
        docs += [json.loads(l).get("text", "") for l in p.open(encoding="utf-8") if l.strip()]
    elif p.is_file() and p.suffix in (".txt", ".raw", ""):
        docs += p.read_text(encoding="utf-8", errors="replace").split("\n\n")
for p in sorted((shared / "data/instruct").rglob("*.jsonl")):
    for l in p.open(encoding="utf-8"):
        if l.strip():
            r = json.loads(l)
            docs.append("\n".join(str(v) for v in r.values() if isinstance(v, str)))
hard = [c["text"] for c in json.load(open(shared / "fixtures/tokenizers/llama3.details.json"))["cases"]]
out, size, i = [], 0, 0
while size < target:
    d = docs[i % len(docs)] if i % 20 else hard[(i // 20) % len(hard)]
    i += 1
    if not d.strip():
        continue
    # chunks of at most ~8 KB, cut at line ends
    for j in range(0, len(d), 8000):
        out.append(d[j:j + 8000])
        size += len(out[-1].encode("utf-8"))
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for c in out:
        f.write(json.dumps(c, ensure_ascii=False) + "\n")
PY

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p')"
RUST=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false NODE_PATH="$NPM_DIR/node_modules" \
       node bench/tokenizer_rust.js "$TOK/tokenizer.json" "$WORK/chunks.jsonl")
EMOE=$(build/bench/bench_tokenizer "$TOK" "$WORK/chunks.jsonl")
echo "$RUST"
echo "$EMOE"
python3 - "$RUST" "$EMOE" <<'PY'
import json, sys
r, e = json.loads(sys.argv[1]), json.loads(sys.argv[2])
same = r["ids_fnv1a"] == e["ids_fnv1a"] and r["tokens"] == e["tokens"]
print(f"throughput emoe/rust = {e['mb_per_s'] / r['mb_per_s']:.2f} "
      f"({e['mb_per_s']:.2f} vs {r['mb_per_s']:.2f} MB/s on {e['bytes'] / 1e6:.1f} MB, one thread); "
      f"ids identical: {'yes' if same else 'NO'}")
sys.exit(0 if same else 1)
PY
