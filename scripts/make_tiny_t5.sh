#!/usr/bin/env bash
# A tiny T5 (d_model 64, 2 + 2 blocks, vocabulary 613: 512 pieces, 100 sentinels, <pad>) on the shared
# SentencePiece model (saved as a T5Tokenizer with 100 sentinels), briefly pretrained with span
# corruption on a small corpus by `emoe pretrain`.
# Usage: scripts/make_tiny_t5.sh OUTPUT_DIR [STEPS]
set -euo pipefail
out=${1:?usage: $0 OUTPUT_DIR [STEPS]}
steps=${2:-200}
root=$(cd "$(dirname "$0")/.." && pwd)
emoe=${EMOE:-$root/build/emoe}
shared=${SHARED:-$root/../shared}
"$emoe" pretrain --set arch=t5 --set hidden=64 --set layers=2 --set heads=4 --set intermediate=256 \
  --set tokenizer="$shared/fixtures/tokenizers/llama-tok512" \
  --set corpus="$shared/data/corpus/wiki_demo.txt" --set steps="$steps" --set batch_size=16 \
  --set max_length=64 --set lr=3e-3 --set log_every=50 --set output="$out"
