#!/usr/bin/env bash
# clang-format over every C++ source of the project (.clang-format: Google style, 100 columns).
#   scripts/format.sh           rewrites the files in place
#   scripts/format.sh --check   lists the files clang-format would change; exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
FORMAT=${CLANG_FORMAT:-$(command -v clang-format || command -v clang-format-14 || true)}
if [ -z "$FORMAT" ]; then
  echo "format: clang-format not found (scripts/setup.sh installs it)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files -- 'src/*.h' 'src/*.cpp' 'apps/*.h' 'apps/*.cpp' 'tests/*.h' \
                       'tests/*.cpp' 'bench/*.h' 'bench/*.cpp' 'fuzz/*.cpp' | sort)
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! "$FORMAT" --style=file "$f" | cmp -s - "$f"; then
      echo "format: $f is not clang-formatted (run scripts/format.sh)"
      bad=$((bad + 1))
    fi
  done
  echo "format: ${#files[@]} files checked, $bad not formatted"
  [ "$bad" -eq 0 ]
else
  "$FORMAT" --style=file -i "${files[@]}"
  echo "format: ${#files[@]} files formatted"
fi
