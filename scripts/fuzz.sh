#!/usr/bin/env bash
# libFuzzer on emoe's file parsers (see fuzz/): builds build-fuzz/ with clang-14 (ASan + UBSan),
# writes seed corpora from ../shared, runs each target for SECONDS (default 600), and prints
# executions, coverage and findings per target. Crash reproducers land in build-fuzz/findings/.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
command -v clang++-14 > /dev/null || { echo "fuzz.sh: clang++-14 not installed (scripts/setup.sh installs it)" >&2; exit 2; }
[[ -d ../shared/tokenizers ]] || { echo "fuzz.sh: ../shared/tokenizers not found (seed corpora)" >&2; exit 2; }
cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
ninja -C build-fuzz > /dev/null
seeds=build-fuzz/seeds/tokenizer_files
mkdir -p "$seeds" build-fuzz/corpus/tokenizer_files build-fuzz/findings
python3 - "$seeds" <<'PY'
import json, sys, os
out = sys.argv[1]
sep = b"\n\x01\n"
sh = "../shared"
bert = open(f"{sh}/tokenizers/bert-base-uncased/vocab.txt", "rb").read()
mini = open(f"{sh}/models/bert-mini/vocab.txt", "rb").read()
cfg = open(f"{sh}/models/bert-mini/tokenizer_config.json", "rb").read()
gvocab = json.load(open(f"{sh}/fixtures/tokenizers/gpt2/vocab.json", encoding="utf-8"))
merges = open(f"{sh}/fixtures/tokenizers/gpt2/merges.txt", "rb").read().split(b"\n")
small_vocab = dict(list(sorted(gvocab.items(), key=lambda kv: kv[1]))[:600])
small_merges = b"\n".join(merges[:200])
def w(name, data):
    open(os.path.join(out, name), "wb").write(data)
w("wordpiece_small", b"\x01" + b"\n".join(bert.split(b"\n")[:2500]) + sep + cfg)
w("wordpiece_mini", b"\x01" + mini)
w("bpe_small", b"\x02" + json.dumps(small_vocab).encode() + sep + small_merges)
wp_json = {"version": "1.0", "added_tokens": [{"id": 0, "content": "[PAD]", "special": True}],
           "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None,
                          "clean_text": True, "handle_chinese_chars": True},
           "pre_tokenizer": {"type": "BertPreTokenizer"},
           "post_processor": {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                         {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]},
                                                 "[SEP]": {"id": "[SEP]", "ids": [102], "tokens": ["[SEP]"]}}},
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
           "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                     "max_input_chars_per_word": 100,
                     "vocab": {t.decode("utf-8", "replace"): i for i, t in enumerate(bert.split(b"\n")[:1500])}}}
w("tokenizer_json_wordpiece", b"\x00" + json.dumps(wp_json).encode())
bpe_json = {"version": "1.0", "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True}],
            "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "post_processor": {"type": "ByteLevel", "trim_offsets": False}, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": small_vocab,
                      "merges": [m.decode() for m in merges[1:200] if m]}}
w("tokenizer_json_bpe", b"\x00" + json.dumps(bpe_json).encode())
PY
status=0
for target in tokenizer_files; do
  log=build-fuzz/$target.log
  # -rss_limit_mb/-malloc_limit_mb: an unbounded allocation counts as a finding
  build-fuzz/fuzz_$target build-fuzz/corpus/$target build-fuzz/seeds/$target -max_total_time="$seconds" \
    -max_len=400000 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/findings/$target- > "$log" 2>&1 || status=1
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  echo "| $target | $seconds s | $execs | $cov | $(ls build-fuzz/findings | grep -c "^$target-" || true) |"
done
exit $status
