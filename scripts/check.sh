#!/usr/bin/env bash
# The whole test suite built with UndefinedBehaviorSanitizer (CMakePresets.json, preset "ubsan";
# every finding aborts the test that hit it). About 10 min to build and 5 min to run on 2 cores.
# AddressSanitizer is not offered: its runtime refuses dlopen(RTLD_DEEPBIND), which the
# SentencePiece shim needs (see src/emoe/tokenizer/spm_library.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
cmake --preset ubsan > /dev/null
cmake --build build-ubsan -j "$JOBS"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-ubsan -j "$JOBS" --output-on-failure "$@"
