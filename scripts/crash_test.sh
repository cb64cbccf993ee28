#!/usr/bin/env bash
# Crash safety of training (issue 8): kill the trainer with SIGKILL at random moments — with a
# checkpoint written after every step, many kills land while one is being written — then
# `--resume`, KILLS times; finish the run and require its final weights to be byte-identical to
# those of a run that was never interrupted. Usage: scripts/crash_test.sh [KILLS] (default 20).
# Needs ../shared (stories260K and SST-2). Exit 0 on success; prints what failed otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
EMOE=${EMOE:-build/emoe}
if [ ! -d ../shared/models/stories260K/hf ] || [ ! -d ../shared/data/glue/SST-2 ]; then
  [ "${CI:-}" = true ] && { echo "crash test: ../shared is missing, and CI=true requires it"; exit 1; }
  echo "crash test: skipped: ../shared not found"
  exit 77
fi
KILLS=${1:-20}
SEED=${SEED:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--set model=../shared/models/stories260K/hf --set task=sst2 --set data_dir=../shared/data
      --set method=emoe --set moe.experts=4 --set moe.topk=2 --set "moe.layers=[1,3]"
      --set train.max_train_examples=1200 --set train.max_eval_examples=32 --set train.batch_size=8
      --set train.epochs=2 --set train.max_length=32 --set train.save_every=1 --set train.lr=1e-3
      --set save_best=false -q)
final_weights() { echo "$1/checkpoints/$(cat "$1/checkpoints/latest")/model.safetensors"; }

echo "crash test: reference run"
"$EMOE" train "${args[@]}" -o "$tmp/ref" > /dev/null
# the interrupted runs compute on the reference run's timed kernels (README "Kernels chosen by
# timing"): two processes may time a close call differently, which is not what this tests
export EMOE_KERNELS="$tmp/ref/kernels.json"
RANDOM=$SEED
kills=0 finished=0
for i in $(seq 1 "$KILLS"); do
  resume=()
  [ -d "$tmp/crash/checkpoints" ] && resume=(--resume)
  "$EMOE" train "${args[@]}" "${resume[@]}" -o "$tmp/crash" > /dev/null 2> "$tmp/err" &
  pid=$!
  # 0.3 .. 2.3 s: start-up, data, conversion, then steps with a checkpoint after each
  sleep "$(printf '0.%03d' $((RANDOM % 1000)))"
  sleep "$((RANDOM % 2)).$((RANDOM % 10))3"
  if kill -9 "$pid" 2> /dev/null; then
    wait "$pid" 2> /dev/null || true
    kills=$((kills + 1))
    step=$(cat "$tmp/crash/checkpoints/latest" 2> /dev/null || echo none)
    echo "crash test: kill $kills at latest checkpoint $step"
  else
    wait "$pid" || { echo "crash test: FAILED: a resumed run exited with an error:"; cat "$tmp/err"; exit 1; }
    finished=1
    echo "crash test: the run finished before kill $i"
    break
  fi
done
if [ "$finished" = 0 ]; then
  "$EMOE" train "${args[@]}" --resume -o "$tmp/crash" > /dev/null 2> "$tmp/err" ||
    { echo "crash test: FAILED: the final resume exited with an error:"; cat "$tmp/err"; exit 1; }
fi
if cmp -s "$(final_weights "$tmp/ref")" "$(final_weights "$tmp/crash")"; then
  echo "crash test: passed ($kills kills; final weights byte-identical to the uninterrupted run)"
else
  echo "crash test: FAILED: final weights differ from the uninterrupted run"
  exit 1
fi
