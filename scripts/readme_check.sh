#!/usr/bin/env bash
# The README as a contract (issue 29): runs every example command of the README, in order, in a
# scratch folder, and fails on a non-zero exit, a promised output that is missing, or a printed
# table whose shape differs from the one the README shows.
#
# Usage: scripts/readme_check.sh [--full] [--readme FILE] [--keep]
#   (default)  quick: each command gets its QUICK settings below (minutes, not hours)
#   --full     runs the commands exactly as written (hours on 2 cores)
#   --readme   checks another file (the tests break a copy of the README on purpose)
#   --keep     leaves the scratch folder in place (its path is printed)
# EMOE=/path/to/emoe is run as build/emoe (default: build/emoe of this checkout). Needs ../shared:
# skipped (exit 77) without it, or failed when CI=true.
#
# The rules, stated once (the README points here):
# - An example is every line of a ```sh fenced block that is neither blank nor a comment (a line
#   ending in "\" continues on the next). ```bash blocks are illustrations that need other
#   machines (several hosts, a GPU) and are not run.
# - Each example runs with bash from the scratch folder, which links build/emoe, configs/ and
#   scripts/ and sees ../shared, so every relative path works as the README writes it. An input an
#   example needs must come from an earlier example: the scratch folder starts empty.
# - Promised outputs: `-o PATH` / `--output PATH` must exist afterwards, and so must every path or
#   glob listed in a trailing comment `# -> PATH ...`.
# - A plain ``` block whose first line is `$ COMMAND` shows what the example COMMAND prints: every
#   markdown table in it must come out with the same header row and the same first column. The
#   numbers are not compared (they depend on the CPU's kernels).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# Commands that are not run here, and why (matched at the start of the command).
SKIP=(
  "scripts/setup.sh|installs packages with apt and builds: done before this check can run"
  "scripts/test.sh|the test suite itself, which runs this check"
)
# Quick mode: the sed expression (sed -E) applied to a command that starts with the first field,
# to make it run in seconds; the README's own values stay what a user runs.
QUICK=(
  "build/emoe demo => s/$/ --quick/"
  "build/emoe train => s/$/ --set train.max_steps=4 --set train.max_train_examples=64 --set train.max_eval_examples=32/"
  "build/emoe sweep => s/$/ --set train.max_steps=2 --set train.max_train_examples=32 --set train.max_eval_examples=16/"
  "build/emoe eval => s/--max-examples [0-9]+//; s/$/ --max-examples 32/"
  "build/emoe prune => s/$/ --max-examples 32/"
  "build/emoe bench => s/--batch [0-9]+ --seq [0-9]+/--batch 2 --seq 16 --steps 1/"
  "build/emoe pretrain => s/--set steps=[0-9]+/--set steps=5/"
  "scripts/make_tiny_t5.sh => s/$/ 20/"
)

readme="$root/README.md" full=0 keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --full) full=1 ;;
    --keep) keep=1 ;;
    --readme) readme=${2:?--readme needs a file}; shift ;;
    *) echo "usage: $0 [--full] [--readme FILE] [--keep]" >&2; exit 2 ;;
  esac
  shift
done
readme=$(cd "$(dirname "$readme")" && pwd)/$(basename "$readme")
[ -f "$readme" ] || { echo "readme_check: $readme: not found"; exit 2; }
emoe=${EMOE:-$root/build/emoe}
[ -x "$emoe" ] || { echo "readme_check: $emoe: not built (run scripts/setup.sh)"; exit 2; }
emoe=$(cd "$(dirname "$emoe")" && pwd)/$(basename "$emoe")
if [ ! -d "$root/../shared/models" ]; then
  [ "${CI:-}" = true ] && { echo "readme_check: ../shared is missing, and CI=true requires it"; exit 1; }
  echo "readme_check: skipped: ../shared not found"
  exit 77
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/emoe-readme.XXXXXX")
[ "$keep" = 1 ] || trap 'rm -rf "$scratch"' EXIT
work="$scratch/repo"
mkdir -p "$work/build"
ln -s "$(cd "$root/../shared" && pwd)" "$scratch/shared"
ln -s "$emoe" "$work/build/emoe"
ln -s "$root/configs" "$work/configs"
ln -s "$root/scripts" "$work/scripts"
export EMOE="$emoe"

# The examples: "LINE<TAB>COMMAND" for every command line of a ```sh block.
examples() {
  awk '
    /^```/ { if (!inblock) { inblock = 1; sh = ($0 ~ /^```sh[ \t]*$/) } else inblock = 0; next }
    inblock && sh {
      line = $0
      if (cont != "") { cmd = cont " " line; cont = "" } else { cmd = line; at = NR }
      if (cmd ~ /\\$/) { sub(/\\$/, "", cmd); cont = cmd; next }
      t = cmd; sub(/^[ \t]+/, "", t)
      if (t == "" || t ~ /^#/) next
      print at "\t" t
    }' "$readme"
}
# Every output block: "LINE<TAB>COMMAND" for each plain ``` block whose first line is "$ COMMAND".
output_blocks() {
  awk '
    /^```/ { if (!inblock) { inblock = 1; first = 1; plain = ($0 ~ /^```[ \t]*$/) } else inblock = 0; next }
    inblock && first { first = 0; if (plain && $0 ~ /^\$ /) print NR "\t" substr($0, 3) }' "$readme"
}
# The lines of the output block that starts at README line $1.
output_block_text() {
  awk -v at="$1" 'NR > at && /^```/ { exit } NR > at' "$readme"
}
# The shape of the markdown tables on stdin: each header row (cells trimmed) and the first cell
# of each row below it.
table_shape() {
  awk '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    function cells(s,   n, i, c, out) {
      n = split(s, c, "|"); out = ""
      for (i = 2; i < n; i++) out = out "|" trim(c[i])
      return out "|"
    }
    /^\|/ {
      if (!intable) { intable = 1; header = $0; rows = -1; next }
      if (rows < 0) {
        if ($0 ~ /^\|[-:| ]+\|[ \t]*$/) { print "table " cells(header); rows = 0 } else intable = 0
        next
      }
      split($0, c, "|"); print "  row " trim(c[2]); next
    }
    { intable = 0 }'
}
strip_comment() { sed -E 's/[[:space:]]+#.*$//' <<< "$1"; }
promised_globs() { grep -oE '#[[:space:]]*->.*$' <<< "$1" | sed -E 's/^#[[:space:]]*->//'; }

fail() {
  echo "readme_check: FAILED: $readme line $1: $2"
  [ -n "${3:-}" ] && [ -f "$3" ] && tail -n 25 "$3" | sed 's/^/  | /'
  exit 1
}

mapfile -t EXAMPLES < <(examples)
mapfile -t OUTPUTS < <(output_blocks)
[ "${#EXAMPLES[@]}" -gt 0 ] || fail 1 "no example commands found (\`\`\`sh blocks)"
for o in "${OUTPUTS[@]}"; do
  shown=${o#*$'\t'} found=0
  for e in "${EXAMPLES[@]}"; do [ "$(strip_comment "${e#*$'\t'}")" = "$shown" ] && found=1; done
  [ "$found" = 1 ] || fail "${o%%$'\t'*}" "the output shown for '$shown' belongs to no example"
done

echo "readme_check: ${#EXAMPLES[@]} examples from $readme, $([ $full = 1 ] && echo full || echo quick) mode, in $work"
ran=0 skipped=0 start=$SECONDS
for e in "${EXAMPLES[@]}"; do
  line=${e%%$'\t'*} text=${e#*$'\t'}
  cmd=$(strip_comment "$text")
  why=""
  for s in "${SKIP[@]}"; do [[ "$cmd" == "${s%%|*}"* ]] && why=${s#*|}; done
  if [ -n "$why" ]; then
    echo "  skip  line $line: $cmd ($why)"
    skipped=$((skipped + 1))
    continue
  fi
  run=$cmd
  if [ "$full" = 0 ]; then
    for q in "${QUICK[@]}"; do
      [[ "$cmd" == "${q%% => *}"* ]] && run=$(sed -E "${q#* => }" <<< "$run")
    done
  fi
  log="$scratch/log-$line"
  t0=$SECONDS
  (cd "$work" && bash -c "$run") > "$log.out" 2> "$log.err"
  rc=$?
  status=ran
  [ "$rc" = 0 ] || status=FAIL
  echo "  $status  line $line ($((SECONDS - t0)) s): $run"
  if [ "$rc" != 0 ]; then
    cat "$log.out" "$log.err" > "$log"
    fail "$line" "exit code $rc: $run" "$log"
  fi
  ran=$((ran + 1))
  # -o / --output PATH, and the paths of a trailing "# -> ..." comment
  read -ra words <<< "$cmd"
  promised=()
  for ((i = 0; i + 1 < ${#words[@]}; i++)); do
    case "${words[i]}" in -o | --output) promised+=("${words[i + 1]}") ;; esac
  done
  read -ra more <<< "$(promised_globs "$text")"
  promised+=("${more[@]}")
  for p in "${promised[@]}"; do
    (cd "$work" && compgen -G "$p" > /dev/null) || fail "$line" "promised output '$p' is missing after: $cmd"
  done
  # the printed tables against the output block the README shows for this command
  for o in "${OUTPUTS[@]}"; do
    [ "${o#*$'\t'}" = "$cmd" ] || continue
    want=$(output_block_text "${o%%$'\t'*}" | table_shape)
    got=$(table_shape < "$log.out")
    if [ "$want" != "$got" ]; then
      echo "readme_check: the tables printed by line $line differ in shape from README line ${o%%$'\t'*}:"
      diff <(echo "$want") <(echo "$got") | sed 's/^/  /'
      fail "${o%%$'\t'*}" "table shape (header row or first column) differs from what '$cmd' prints"
    fi
    echo "        tables as shown at line ${o%%$'\t'*}: $(grep -c '^table' <<< "$want") table(s), $(grep -c 'row' <<< "$want") rows"
  done
done
echo "readme_check: passed: $ran examples ran, $skipped skipped, in $((SECONDS - start)) s"
