#!/usr/bin/env bash
# libFuzzer on emoe's file parsers (see fuzz/): builds build-fuzz/ with clang-14 (ASan + UBSan),
# writes seed corpora from ../shared (and configs/), runs each target for SECONDS (default 600),
# one after the other, and prints executions, coverage and findings per target as table rows.
# Crash reproducers land in build-fuzz/findings/.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#   targets: tokenizer_files sentencepiece safetensors model_config datasets run_config moe_json
#   (default: all). JOBS=N sets ninja's parallelism (default: ninja's own).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
all=(tokenizer_files sentencepiece safetensors model_config datasets run_config moe_json)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (targets: ${all[*]})" >&2; exit 2; }
done
command -v clang++-14 > /dev/null || { echo "fuzz.sh: clang++-14 not installed (scripts/setup.sh installs it)" >&2; exit 2; }
[[ -d ../shared/tokenizers && -d ../shared/fixtures/tiny ]] || { echo "fuzz.sh: ../shared not found (seed corpora)" >&2; exit 2; }
cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
ninja -C build-fuzz ${JOBS:+-j"$JOBS"} $(printf 'fuzz_%s ' "${targets[@]}") > /dev/null
mkdir -p build-fuzz/findings
for t in "${targets[@]}"; do mkdir -p "build-fuzz/seeds/$t" "build-fuzz/corpus/$t"; done

# --- seed corpora ---------------------------------------------------------------------------------
python3 - "${targets[@]}" <<'PY'
import glob, json, os, struct, sys
sh = "../shared"
targets = set(sys.argv[1:])
sep = b"\n\x01\n"
def w(target, name, data):
    open(os.path.join("build-fuzz/seeds", target, name), "wb").write(data)
def read(p):
    return open(p, "rb").read()
tiny = sorted(glob.glob(f"{sh}/fixtures/tiny/*/"))

if "tokenizer_files" in targets:
    t = "tokenizer_files"
    bert = read(f"{sh}/tokenizers/bert-base-uncased/vocab.txt")
    mini = read(f"{sh}/models/bert-mini/vocab.txt")
    cfg = read(f"{sh}/models/bert-mini/tokenizer_config.json")
    gvocab = json.load(open(f"{sh}/fixtures/tokenizers/gpt2/vocab.json", encoding="utf-8"))
    merges = read(f"{sh}/fixtures/tokenizers/gpt2/merges.txt").split(b"\n")
    small_vocab = dict(list(sorted(gvocab.items(), key=lambda kv: kv[1]))[:600])
    w(t, "wordpiece_small", b"\x01" + b"\n".join(bert.split(b"\n")[:2500]) + sep + cfg)
    w(t, "wordpiece_mini", b"\x01" + mini)
    w(t, "bpe_small", b"\x02" + json.dumps(small_vocab).encode() + sep + b"\n".join(merges[:200]))
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
                         "vocab": {t_.decode("utf-8", "replace"): i for i, t_ in enumerate(bert.split(b"\n")[:1500])}}}
    w(t, "tokenizer_json_wordpiece", b"\x00" + json.dumps(wp_json).encode())
    bpe_json = {"version": "1.0", "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True}],
                "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
                "post_processor": {"type": "ByteLevel", "trim_offsets": False}, "decoder": {"type": "ByteLevel"},
                "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": small_vocab,
                          "merges": [m.decode() for m in merges[1:200] if m]}}
    w(t, "tokenizer_json_bpe", b"\x00" + json.dumps(bpe_json).encode())

if "sentencepiece" in targets:
    t = "sentencepiece"
    model = read(f"{sh}/fixtures/tokenizers/llama-tok512/tokenizer.model")
    w(t, "llama_tok512", b"\x00" + model)
    w(t, "stories260k", b"\x00" + read(f"{sh}/models/stories260K/hf/tokenizer.model") + sep +
      read(f"{sh}/models/stories260K/hf/tokenizer_config.json"))
    # a piece list: flags (BPE, byte fallback, dummy prefix, extra whitespace, escape), unk/bos/eos/pad
    pieces = [b"\x02\x00<unk>", b"\x03\x00<s>", b"\x03\x00</s>"]
    pieces += [b"\x06\x00<0x%02X>" % i for i in range(256)]
    pieces += [b"\x01" + bytes([(256 - i) % 256]) + p.encode() for i, p in
               enumerate(["\u2581", "\u2581t", "he", "\u2581the", "e", "t", "h", "a", "\u2581a", "n", "d", "\u2581and", "\u00e9", "\u6771"])]
    w(t, "piece_list_bpe", b"\x01" + bytes([2 | 4 | 8 | 16, 0, 1, 2, 0xff]) + b"\n".join(pieces))
    w(t, "piece_list_unigram", b"\x01" + bytes([1 | 4 | 8 | 16 | 32, 0, 1, 2, 0xff]) + b"\n".join(pieces[:3] + pieces[259:]))

def shrink_safetensors(path, keep):
    data = read(path)
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out, chunks, off = {}, [], 0
    if "__metadata__" in header:
        out["__metadata__"] = header["__metadata__"]
    for name in [k for k in header if k != "__metadata__"][:keep]:
        e = header[name]
        b, x = e["data_offsets"]
        chunk = body[b:x]
        out[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [off, off + len(chunk)]}
        chunks.append(chunk)
        off += len(chunk)
    text = json.dumps(out).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)

if "safetensors" in targets:
    t = "safetensors"
    for d in tiny:
        name = os.path.basename(os.path.dirname(d))
        w(t, name + "_fixture", read(d + "fixture.safetensors"))
        w(t, name + "_model3", shrink_safetensors(d + "model.safetensors", 3))
    w(t, "bert_model_full", read(f"{sh}/fixtures/tiny/bert_model/model.safetensors"))
    # every dtype the reader knows, one small tensor each
    hdr, body = {"__metadata__": {"format": "pt"}}, b""
    for dt, size in [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2), ("I64", 8), ("I32", 4), ("I16", 2), ("I8", 1), ("U8", 1), ("BOOL", 1)]:
        hdr[dt.lower()] = {"dtype": dt, "shape": [2, 1], "data_offsets": [len(body), len(body) + 2 * size]}
        body += b"\x01" * (2 * size)
    hdr["empty"] = {"dtype": "F32", "shape": [0, 3], "data_offsets": [len(body), len(body)]}
    text = json.dumps(hdr).encode()
    w(t, "all_dtypes", struct.pack("<Q", len(text)) + text + body)

if "model_config" in targets:
    t = "model_config"
    for d in tiny:
        w(t, os.path.basename(os.path.dirname(d)), read(d + "config.json"))
    w(t, "bert_mini", read(f"{sh}/models/bert-mini/config.json"))
    w(t, "stories260k", read(f"{sh}/models/stories260K/hf/config.json"))

if "datasets" in targets:
    t = "datasets"
    def head(p, lines=12):
        return b"\n".join(read(p).split(b"\n")[:lines]) + b"\n"
    w(t, "table_tsv", b"\x00\x00sentence\tlabel\nhello world\tpos\n\"quoted\ttab\"\tneg\n")
    w(t, "table_tsv_pair_noheader", b"\x00\x05first\tsecond\t1\nthird\tfourth\t0\n")
    w(t, "table_csv", b"\x01\x10sentence,label\n\"a, \"\"quoted\"\"\nmultiline\",pos\nb,neg\n")
    w(t, "table_csv_regression", b"\x01\x24sentence1,sentence2,label\nx,y,0.5\nz,w,3.25\n")
    w(t, "table_jsonl", b"\x02\x00" + b'{"sentence": "hello", "label": 1}\n{"sentence": "bye", "label": 0}\n')
    w(t, "table_jsonl_labels", b"\x02\x14" + b'{"sentence1": "a", "sentence2": "b", "label": "pos"}\n')
    glue = [(0, "SST-2/dev.tsv"), (1, "CoLA/raw/in_domain_train.tsv"), (2, "CoLA/glue_test_unlabeled.tsv"),
            (4, "MNLI/textfooler_1k/mnli_matched.tsv"), (5, "STS-B/dev.tsv"), (7, "MRPC/test.tsv")]
    for opt, f in glue:
        w(t, "glue_" + f.replace("/", "_"), b"\x03" + bytes([opt]) + head(f"{sh}/data/glue/{f}"))
    gx = f"{sh}/data/ood/glue_x_human_annotated/tsv_DERIVED"
    ood = [(0, f"{gx}/SA_12.7__imdb.tsv"), (1, f"{gx}/sampled_flipkart__Sheet1.tsv"),
           (2, f"{gx}/textual_entailment__hans.tsv"), (3, f"{sh}/data/ood/nli/snli_1.0_test_hard.jsonl"),
           (4, f"{sh}/data/ood/nli/textfooler_snli_1k.tsv"), (5, f"{sh}/data/ood/sentiment/textfooler/imdb_1k.txt"),
           (8, f"{sh}/data/glue/CoLA/raw/out_of_domain_dev.tsv"), (9, f"{gx}/stsb_ood__stsb.tsv")]
    for opt, f in ood:
        if os.path.exists(f):
            w(t, "ood_" + os.path.basename(f), b"\x04" + bytes([opt]) + head(f, 6))
    adv = json.load(open(f"{sh}/data/ood/advglue/dev.json"))
    small = {k: v[:3] for k, v in adv.items()} if isinstance(adv, dict) else adv
    w(t, "ood_advglue", b"\x04\x06" + json.dumps(small).encode())
    alpaca = json.load(open(f"{sh}/data/instruct/alpaca/alpaca_5000.json"))
    w(t, "alpaca", b"\x05\x00" + json.dumps(alpaca[:6]).encode())
    for f in sorted(glob.glob(f"{sh}/data/instruct/mmlu/data/val/*.csv"))[:3]:
        w(t, "mmlu_" + os.path.basename(f), b"\x06\x00" + head(f, 5))

if "run_config" in targets:
    t = "run_config"
    for f in sorted(glob.glob("configs/*.yaml")) + sorted(glob.glob("configs/table/*.yaml")):
        w(t, f.replace("/", "_"), read(f))

if "moe_json" in targets:
    t = "moe_json"
    def state(method, experts, topk, layers, d_ff, gate):
        perm = list(range(d_ff))
        perm[0], perm[-1] = perm[-1], perm[0]
        return {"format": "emoe-moe", "version": 1, "emoe_version": "0.1.0", "source": "../shared/models/bert-mini",
                "config": {"method": method, "experts": experts, "topk": topk, "layers": layers,
                           "split": "balanced-kmeans", "seed": 0,
                           "kmeans": {"restarts": 1, "max_iter": 30, "tol": 1e-4}, "gate": gate,
                           "gate_init": "avgk", "execution": "masked", "weighted": method != "emoe",
                           "tutel": False, "gate_noise": 0.0, "softmax_before_topk": False,
                           "capacity_factor": 0.0, "batch_prioritized": True, "balance_loss": "none",
                           "balance_weight": 0.01, "preact_dropout": 0.0, "cosine_dim": 256, "sample_tokens": 4096},
                "layers": {str(l): {"split": "balanced-kmeans", "permutation": perm,
                                    "cluster_sizes": [d_ff // experts] * experts, "inertia": 1.5,
                                    "random_inertia": 2.5, "split_seconds": 0.1, "iterations": 7,
                                    "restarts": 1, "allowed": list(range(experts))[:2]} for l in layers}}
    w(t, "emoe", json.dumps(state("emoe", 8, 2, [1, 3], 64, "avgk"), indent=1).encode())
    w(t, "emoe_learn", json.dumps(state("emoe-learn", 4, 1, [0], 32, "linear")).encode())
    w(t, "gmoe", json.dumps(state("gmoe", 16, 4, [8, 10], 48, "cosine")).encode())
PY

# --- runs -----------------------------------------------------------------------------------------
declare -A max_len=([tokenizer_files]=400000 [sentencepiece]=65536 [safetensors]=262144
                    [model_config]=16384 [datasets]=65536 [run_config]=16384 [moe_json]=65536)
status=0
for target in "${targets[@]}"; do
  log=build-fuzz/$target.log
  # -rss_limit_mb/-malloc_limit_mb: an unbounded allocation counts as a finding; -timeout: a hang
  build-fuzz/fuzz_$target build-fuzz/corpus/$target build-fuzz/seeds/$target -max_total_time="$seconds" \
    -max_len="${max_len[$target]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/findings/$target- > "$log" 2>&1 || status=1
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  echo "| $target | $seconds s | $execs | $cov | $(ls build-fuzz/findings | grep -c "^$target-" || true) |"
done
exit $status
