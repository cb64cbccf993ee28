#!/bin/sh
# The benchmarks' flags (bench/bench_common.h, parse_flags): a bad one gives one error line that
# names it, then the usage, and exit 2; --help gives the usage and exit 0. Usage: BUILD_DIR.
set -u
build=$1
fail=0
# check PROGRAM EXIT TEXT ARGS...: the program's exit code and a line of its output
check() {
  prog=$1 want=$2 text=$3
  shift 3
  out=$("$build/bench/$prog" "$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want" ] || ! printf '%s\n' "$out" | grep -qF -- "$text" ||
    ! printf '%s\n' "$out" | grep -qF -- "$prog ["; then
    echo "FAIL: $prog $* -> exit $rc (wanted $want, '$text' and the usage):"
    printf '%s\n' "$out" | head -5
    fail=1
  fi
}
check bench_train 2 "bench_train: error: --steps: expected a positive integer, got '0'" --steps 0
check bench_train 2 "bench_train: error: --warmup: expected a non-negative integer, got '-1'" --warmup -1
check bench_train 2 "bench_train: error: --peak-seconds: expected seconds above 0, got 'x'" --peak-seconds x
check bench_train 2 "bench_train: error: --precision: expected fp32, bf16 or both, got 'fp16'" --precision fp16
check bench_train 0 "bench_train --single MODEL METHOD PRECISION" --help
check bench_eager 2 "bench_eager: error: --new: expected at least 2 tokens" --new 1
check bench_eager 2 "bench_eager: error: unknown argument '--bogus'" --bogus
check bench_eager 2 "bench_eager: error: --methods: expected full and/or lora, got 'emoe'" --methods full,emoe
check bench_eager 2 "bench_eager: error: --models: expected a list like bert-base" --models ,
check bench_generate 2 "bench_generate: error: --batches: expected a positive integer, got 'x'" --batches 1,x
check bench_generate 2 "bench_generate: error: --reps: expected a value" --reps
check bench_generate 0 "[--kv-heads H]" -h
check bench_ffn 2 "bench_ffn: error: expected at most two positional arguments (TOKENS REPS)" 1 2 3
[ "$fail" = 0 ] && echo "every flag check passed"
exit "$fail"
