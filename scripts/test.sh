#!/usr/bin/env bash
# The README's test command: builds (incrementally) and runs every test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${EMOE_JOBS:-$(nproc)}
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS" "$@"
