#!/usr/bin/env bash
# The GPU check, run on a machine lent through the device tool (prepare with scripts/device_kit.sh).
# Two calls, the second while the machine is still warm (it keeps build-device/ between calls):
#   run(command="STAGES='build golden' bash scripts/device_check.sh", carry=[".devkit"], timeout_s=480)
#   run(command="STAGES=bench bash scripts/device_check.sh", carry=[".devkit"], timeout_s=330)
# (or all in one: run(command="bash scripts/device_check.sh", carry=[".devkit"], timeout_s=600))
# It builds emoe against that machine's PyTorch (its CUDA libtorch) and Debian's libraries from
# .devkit/, runs the golden tests with their models on CUDA (EMOE_TEST_DEVICE=cuda) and the
# training benchmark on CUDA, and writes what it finds to $OUT (what comes back: at most 8 files),
#   summary.txt   the machine, each stage's exit status and time, the test results
#   log.txt       every stage's full output, one after another
#   golden.json   the golden tests (GoogleTest's JSON report)
#   bench-MODEL.md / bench-MODEL.json   bench_train's table and figures, one pair per model
# Stages stop at their own time limits, so whatever ran comes back within one call.
#
#   DEVICE=cpu bash scripts/device_check.sh   a rehearsal here: the same build from .devkit
#                                              against Debian's libtorch, tests and a short
#                                              benchmark on the CPU
# Environment: OUT (default ./device-out), BUILD (default build-device), JOBS (default nproc),
# STAGES (default "build golden bench"), BENCH_MODELS (default bert-base,llama-style),
# BENCH_STEPS (default 5), BENCH_ARGS (default "--precision both"), GOLDEN_FILTER (default
# "-Tokenizer*": the tokenizer suites run on the CPU alone), and each stage's time limit in seconds: CONFIGURE_LIMIT (120),
# BUILD_LIMIT (300), GOLDEN_LIMIT (90), BENCH_LIMIT (150, per model) — sized for 16 cores and
# the device tool's 10-minute call.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KIT=$ROOT/.devkit
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$ROOT/device-out}
BUILD=${BUILD:-build-device}
JOBS=${JOBS:-$(nproc)}
STAGES=${STAGES:-build golden bench}
BENCH_MODELS=${BENCH_MODELS:-bert-base,llama-style}
BENCH_STEPS=${BENCH_STEPS:-5}
BENCH_ARGS=${BENCH_ARGS:---precision both}
GOLDEN_FILTER=${GOLDEN_FILTER:--Tokenizer*}
CONFIGURE_LIMIT=${CONFIGURE_LIMIT:-120}
BUILD_LIMIT=${BUILD_LIMIT:-300}
GOLDEN_LIMIT=${GOLDEN_LIMIT:-90}
BENCH_LIMIT=${BENCH_LIMIT:-150}
ARCH=x86_64-linux-gnu
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
LOG=$OUT/log.txt
: >"$SUMMARY"
: >"$LOG"
say() { echo "[device_check $(date +%T)] $*" | tee -a "$SUMMARY"; }

if [ ! -d "$KIT/root" ] || [ ! -d "$KIT/shared" ]; then
  echo "device_check: $KIT not found: run scripts/device_kit.sh here first, and name .devkit in carry" >&2
  exit 2
fi

# libtorch's CMake files look for the CUDA toolkit (nvcc)
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

# the machine
{
  uname -a
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  nproc
  g++ --version 2>&1 | head -1
  nvcc --version 2>&1 | tail -1
  cmake --version | head -1
} >>"$SUMMARY" 2>&1

# libtorch: the machine's PyTorch where there is one, else (the rehearsal) Debian's
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
TORCH_LIB=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null || true)
say "device $DEVICE, libtorch from ${TORCH_PREFIX:-the system}, $JOBS jobs"
if [ -n "$TORCH_PREFIX" ]; then
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI)' \
    >>"$SUMMARY" 2>&1
fi
# C++ standard: libtorch 2.13 and later require C++20 in their headers
CXX_STD=$(python3 -c 'import torch; v=[int(x) for x in torch.__version__.split("+")[0].split(".")[:2]]; print(20 if v>=[2,13] else 17)' 2>/dev/null || echo 17)

PKG_CONFIG_ARG=()
command -v pkg-config >/dev/null || PKG_CONFIG_ARG=(-DPKG_CONFIG_EXECUTABLE="$KIT/root/usr/bin/pkgconf")
export PKG_CONFIG_PATH="$KIT/root/usr/lib/$ARCH/pkgconfig:$KIT/root/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$KIT/root/usr/lib/$ARCH:$KIT/root/lib/$ARCH${TORCH_LIB:+:$TORCH_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export EMOE_SHARED="$KIT/shared"
status=0
STAGE_LOG=$(mktemp)
trap 'rm -f "$STAGE_LOG"' EXIT

run_stage() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  say "$name: started (limit ${limit} s)"
  echo "===== $name: $*" >>"$LOG"
  timeout "$limit" "$@" >"$STAGE_LOG" 2>&1
  local rc=$?
  cat "$STAGE_LOG" >>"$LOG"
  say "$name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
  return $rc
}

if [[ " $STAGES " == *" build "* ]]; then
  # no oneDNN (a CPU library; the CUDA run needs none); tests listed when they run, not at
  # build time
  run_stage configure "$CONFIGURE_LIMIT" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_STANDARD="$CXX_STD" \
    -DCMAKE_PREFIX_PATH="${TORCH_PREFIX:+$TORCH_PREFIX;}$KIT/root/usr" \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
    -DEMOE_USE_ONEDNN=OFF "${PKG_CONFIG_ARG[@]}" || { tail -30 "$STAGE_LOG"; exit 1; }
  # what the link lines take from outside the kit and libtorch: the machine's own libraries
  # (in a rehearsal here, a library missing from the kit shows up in this list)
  grep -ho "LINK_LIBRARIES = .*" "$BUILD/build.ninja" | tr ' ' '\n' | grep "^/" | sort -u |
    grep -v -e "^$KIT/" ${TORCH_LIB:+-e "^$TORCH_LIB/"} -e "/libtorch" -e "/libc10" >"$STAGE_LOG" || true
  say "linked from outside .devkit and libtorch: $(tr '\n' ' ' <"$STAGE_LOG")"
  run_stage build "$BUILD_LIMIT" cmake --build "$BUILD" -j "$JOBS" --target emoe_cli golden_tests bench_train ||
    { grep -m 20 -E "error|Error" "$STAGE_LOG" | tee -a "$SUMMARY"; tail -5 "$STAGE_LOG"; exit 1; }
fi

for stage in golden bench; do
  if [[ " $STAGES " == *" $stage "* ]] && [ ! -x "$BUILD/tests/golden_tests" ]; then
    say "$stage: $BUILD/ has no build (a fresh machine, or the build stage failed): run the build stage first"
    exit 1
  fi
done

if [[ " $STAGES " == *" golden "* ]]; then
  # the tokenizer suites run on the CPU alone and their files stay here (device_kit.sh)
  EMOE_TEST_DEVICE=$DEVICE run_stage golden "$GOLDEN_LIMIT" "$BUILD/tests/golden_tests" \
    --gtest_filter="$GOLDEN_FILTER" --gtest_output="json:$OUT/golden.json"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$STAGE_LOG" | tee -a "$SUMMARY"
fi

if [[ " $STAGES " == *" bench "* ]]; then
  for model in ${BENCH_MODELS//,/ }; do
    run_stage "bench-$model" "$BENCH_LIMIT" "$BUILD/bench/bench_train" --device "$DEVICE" --models "$model" \
      $BENCH_ARGS --steps "$BENCH_STEPS" --json "$OUT/bench-$model.json" --markdown "$OUT/bench-$model.md"
    [ -f "$OUT/bench-$model.md" ] && cat "$OUT/bench-$model.md"
  done
fi
say "done (exit $status)"
exit $status
