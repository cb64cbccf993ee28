#!/usr/bin/env bash
# scripts/readme_check.sh must fail when the README is wrong: each case breaks one thing in a copy
# of the README on purpose and expects the check to stop there, naming it.
# Usage: tests/readme_check_fails_test.sh (EMOE as for readme_check.sh; 77 = skipped).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect NAME SED_EXPRESSION EXPECTED_MESSAGE: the README with SED_EXPRESSION applied must fail
# the check with EXPECTED_MESSAGE (a fixed string) in its output.
expect() {
  local name=$1 edit=$2 message=$3
  sed -E "$edit" "$root/README.md" > "$tmp/README.md"
  if cmp -s "$root/README.md" "$tmp/README.md"; then
    echo "case '$name': the edit changed nothing in README.md (stale test)"
    failures=$((failures + 1))
    return
  fi
  "$root/scripts/readme_check.sh" --readme "$tmp/README.md" > "$tmp/out" 2>&1
  local rc=$?
  [ "$rc" = 77 ] && { cat "$tmp/out"; exit 77; }
  if [ "$rc" = 1 ] && grep -qF -- "$message" "$tmp/out"; then
    echo "case '$name': failed as it should: $(grep -F 'FAILED' "$tmp/out")"
  else
    echo "case '$name': expected exit 1 with '$message', got exit $rc:"
    tail -n 20 "$tmp/out" | sed 's/^/  | /'
    failures=$((failures + 1))
  fi
}

# an example that no longer runs (a model folder that does not exist)
expect "broken command" 's|^build/emoe info ../shared/models/bert-mini$|build/emoe info ../shared/models/bert-maxi|' \
  "exit code 2: build/emoe info ../shared/models/bert-maxi"
# an output the README promises that the command does not write
expect "missing output" 's|-> runs/demo/report.md|-> runs/demo/no-such-report.md|' \
  "promised output 'runs/demo/no-such-report.md' is missing"
# a printed table whose columns differ from the README's
expect "table shape" 's/^\| method \| trainable \/ total parameters \|/| method | parameters |/' \
  "table shape (header row or first column) differs"

[ "$failures" = 0 ] && echo "readme_check fails on every broken copy, naming the problem"
exit "$((failures > 0))"
