#!/usr/bin/env bash
# The adversarial pass of docs/reliability.md: runs each line of scripts/hostile_cases.txt (an emoe
# command line; $T is a scratch folder of broken fixtures made here, $B bert-mini, $ST
# stories260K, $D the data folder) with -q and prints: command, exit code, stderr lines, first
# stderr line — tab-separated. The promise: exit 2 and one `emoe: error:` line for bad input.
#   scripts/hostile_pass.sh [EMOE] [SHARED] < scripts/hostile_cases.txt
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
E=${1:-$root/build/emoe}; S=${2:-$root/../shared}; T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
B=$S/models/bert-mini; ST=$S/models/stories260K/hf; D=$S/data
echo "x" > $T/file; : > $T/empty; mkdir -p $T/emptydir $T/full; echo hi > $T/full/f
printf 'not json' > $T/garbage.json
mkdir -p $T/run; echo '{}' > $T/run/config.json
mkdir -p $T/usage; cp -r $B/. $T/usage/; echo '{"bad": ' > $T/usage/usage.json
mkdir -p $T/moe; cp -r $B/. $T/moe/; echo '{"method": "emoe"}' > $T/moe/moe.json
(cd $T && $E convert $B -o $T/realmoe -N 4 -k 2 --layers 1 -q >/dev/null 2>&1)
printf 'the cat sat on the mat\n' > $T/corpus.txt
printf '\n\n  \n' > $T/blank.txt
printf 'model: %s\ntask: sst2\ndata_dir: %s\ntrain: {epochs: 1, max_train_examples: 16, max_eval_examples: 16, batch_size: 8}\nsave_best: false\n' $B $D > $T/s.yaml
printf -- '- a\n- b\n' > $T/list.yaml
printf '42\n' > $T/scalar.yaml
p() { local out; out=$(cd $T && timeout 120 $E "$@" -q 2>&1 >/dev/null); local rc=$?; local n; n=$(printf '%s' "$out" | grep -c '^'); printf '%s\t%s\t%s\t%s\n' "$*" "$rc" "$n" "$(printf '%s' "$out" | head -1 | cut -c1-230)"; }
while IFS= read -r line <&3; do [ -z "$line" ] && continue; eval "p $line" </dev/null; done 3<&0
