#!/usr/bin/env bash
# Installs every system dependency of emoe (Debian 12) and builds Release into build/.
# Idempotent: packages already present are skipped and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libgloo-dev              # libtorch 1.13 (CPU) and the headers its c10d needs
  libopenblas0-pthread libopenblas-dev  # fast BLAS for libtorch (else reference BLAS, ~25x slower)
  libdnnl-dev                           # oneDNN (libtorch's own engine): AVX-512 float32 GEMMs
  nlohmann-json3-dev                    # JSON: config.json, safetensors headers, run records
  libyaml-cpp-dev                       # YAML run configs
  libcli11-dev                          # command line
  libfmt-dev libspdlog-dev              # formatting and logging
  libsentencepiece-dev                  # SentencePiece tokenizer.model (Llama, T5)
  libutf8proc-dev                       # Unicode normalisation/categories for WordPiece and BPE
  libpcre2-dev                          # Unicode regexes of tokenizer.json Split pre-tokenizers
  libgtest-dev libgmock-dev             # tests
  liblemon-dev                          # exact min-cost flow for balanced k-means
  libmetis-dev                          # balanced graph partitioning (co-activation split)
  libcairo2-dev fonts-dejavu-core       # PNG figures (usage heatmaps) and their text
  clang-14 libclang-rt-14-dev           # libFuzzer + ASan/UBSan for scripts/fuzz.sh (fuzz/)
  clang-format                          # scripts/format.sh --check (run by the tests)
  python3                               # seed corpora and benchmark summaries in scripts/
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

JOBS=${EMOE_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${EMOE_CMAKE_ARGS:-}
cmake --build build -j "$JOBS"
echo "setup: built build/emoe"
