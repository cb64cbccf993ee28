#!/usr/bin/env bash
# Compiles emoe's sources (syntax only) against libtorch 2.x's headers, here, without a GPU: a
# CUDA machine's PyTorch is 2.x, Debian 12's libtorch is 1.13, and an API difference found on a
# lent GPU machine costs its scarce minutes. Debian 13 (trixie) packages libtorch 2.6: its
# libtorch-dev is downloaded (apt-get download with a sources list of its own; nothing is
# installed) and unpacked under a temporary folder, its headers put before Debian 12's.
#
#   scripts/torch2_check.sh                  every source: the library, the command line, the
#                                            test suites, the benchmarks (~40 min on 2 cores)
#   scripts/torch2_check.sh FILE.cpp ...     just these
# Prints one OK/FAIL line per file and each failure's first errors; exit 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

work=$(mktemp -d /tmp/emoe-torch2.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists" "$work/cache" "$work/debs" "$work/torch" "$work/logs"
echo "deb http://deb.debian.org/debian trixie main" >"$work/sources.list"
APT=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache")
chmod 777 "$work/debs" "$work/lists" "$work/cache"
if ! apt-get "${APT[@]}" update -q >"$work/apt.log" 2>&1 ||
   ! (cd "$work/debs" && apt-get "${APT[@]}" download -q libtorch-dev >>"$work/apt.log" 2>&1); then
  echo "torch2_check: could not download trixie's libtorch-dev:" >&2
  tail -5 "$work/apt.log" >&2
  exit 2
fi
dpkg-deb -x "$work"/debs/libtorch-dev_*.deb "$work/torch"
version=$(awk '/define TORCH_VERSION_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $3; sep="."}' \
  "$work/torch/usr/include/torch/csrc/api/include/torch/version.h")
echo "torch2_check: libtorch ${version:-?} headers from $(basename "$work"/debs/libtorch-dev_*.deb)"

FLAGS=(-std=c++17 -fopenmp -w -DEMOE_HAVE_ONEDNN=1 "-DEMOE_SOURCE_DIR=\"$ROOT\"" '-DEMOE_VERSION="0"'
       '-DEMOE_BINARY="emoe"' -DFMT_SHARED -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL
       -DSPDLOG_SHARED_LIB -DUSE_C10D_GLOO=1 -DUSE_DISTRIBUTED
       -I"$ROOT/src" -I"$ROOT/tests" -I"$ROOT/bench"
       -isystem "$work/torch/usr/include" -isystem "$work/torch/usr/include/torch/csrc/api/include")
for p in cairo glib-2.0 pixman-1 freetype2 libpng16; do FLAGS+=(-isystem "/usr/include/$p"); done
FLAGS+=(-isystem /usr/lib/x86_64-linux-gnu/glib-2.0/include)

# emoe's precompiled header, made once against these headers (as the build's own PCH)
cp src/emoe/pch.h "$work/pch.h"
g++ "${FLAGS[@]}" -x c++-header "$work/pch.h" -o "$work/pch.h.gch" || { echo "torch2_check: pch.h failed" >&2; exit 1; }

if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(find src apps tests bench -name '*.cpp' | sort)
fi
export work
check() {
  local f=$1 log
  log="$work/logs/$(echo "$f" | tr / _).log"
  if g++ -fsyntax-only "${FLAGS[@]}" -include "$work/pch.h" "$f" >"$log" 2>&1; then
    echo "OK   $f"
  else
    echo "FAIL $f"
    grep -m 5 "error" "$log" | sed 's/^/       /'
  fi
}
failed=0
# two at a time per core pair; each file's lines are printed together
for ((i = 0; i < ${#files[@]}; i += $(nproc))); do
  for f in "${files[@]:i:$(nproc)}"; do check "$f" >"$work/logs/out.$(echo "$f" | tr / _)" & done
  wait
  for f in "${files[@]:i:$(nproc)}"; do
    cat "$work/logs/out.$(echo "$f" | tr / _)"
    grep -q "^FAIL" "$work/logs/out.$(echo "$f" | tr / _)" && failed=$((failed + 1))
  done
done
echo "torch2_check: ${#files[@]} files, $failed failed"
[ $failed -eq 0 ]
