#!/usr/bin/env bash
# The whole test suite built with sanitizers (CMakePresets.json), every finding fatal:
#   ubsan  UndefinedBehaviorSanitizer                                  (build-ubsan/)
#   asan   AddressSanitizer + UndefinedBehaviorSanitizer, and LeakSanitizer at each process's exit
#          (build-asan/; scripts/lsan.supp lists the third-party leaks it ignores)
# Under ASan the SentencePiece shim is loaded with dlmopen into a namespace of its own (ASan's
# runtime refuses the dlopen(RTLD_DEEPBIND) of the normal build; src/emoe/tokenizer/spm_library.cpp).
# Each takes about 10-15 min to build and 5-15 min to run on 2 cores.
# Usage: scripts/check.sh [ubsan|asan|all] [ctest arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
[[ $# -gt 0 ]] && shift
case "$which" in ubsan | asan | all) ;; *) echo "check.sh: expected ubsan, asan or all, got '$which'" >&2; exit 2 ;; esac
JOBS=${JOBS:-$(nproc)}
root=$(pwd)
run_preset() {
  local preset=$1
  cmake --preset "$preset" > /dev/null
  cmake --build "build-$preset" -j "$JOBS"
  ctest --test-dir "build-$preset" -j "$JOBS" --output-on-failure "$@"
}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if [[ $which == ubsan || $which == all ]]; then run_preset ubsan "$@"; fi
if [[ $which == asan || $which == all ]]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
  export LSAN_OPTIONS=suppressions=$root/scripts/lsan.supp:print_suppressions=0
  run_preset asan "$@"
fi
