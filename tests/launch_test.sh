#!/usr/bin/env bash
# scripts/launch.sh as a user runs it: a short synthetic job must end with
# exit 0, and everything it prints must be launch's or dp-ps's own lines (no
# error from the script itself, such as a poll reading dp-ps's log before the
# log exists). Every other run is on two dp-ps shards (--shards 2), whose
# saved model must then be the one-shard job's to the byte.
# Usage: launch_test.sh BUILD_DIR [runs]
set -uo pipefail
build=$1
runs=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
failures=0
export TMPDIR=$(mktemp -d)  # launch.sh's run directories, removed at the end
trap 'rm -rf "$TMPDIR"' EXIT
declare -A model_of  # shards -> sha256 of the saved model
for ((i = 1; i <= runs; i++)); do
  shards=$((1 + i % 2))
  out=$(BIN=$build "$here/scripts/launch.sh" --workers 2 --shards "$shards" \
        --dataset=synthetic --max_steps=3 --batch_size=8 \
        --save_model="$TMPDIR/model-$i.safetensors" 2>&1)
  code=$?
  if [ "$code" -ne 0 ]; then
    echo "FAIL run $i ($shards shard(s)): launch.sh exited $code"; failures=$((failures + 1))
  elif ! sha=$(sha256sum <"$TMPDIR/model-$i.safetensors"); then
    echo "FAIL run $i ($shards shard(s)): no model saved"; failures=$((failures + 1))
  elif [ -n "${model_of[$shards]:-}" ] && [ "${model_of[$shards]}" != "$sha" ]; then
    echo "FAIL run $i ($shards shard(s)): another model than the first run on as many shards"; failures=$((failures + 1))
  else
    model_of[$shards]=$sha
  fi
  # The script's own complaints and the shell's: "sed: ...", "line N: ...".
  bad=$(grep -E '^(sed|tee|head|seq|kill|mktemp):|No such file|line [0-9]+:' <<<"$out")
  if [ -n "$bad" ]; then
    echo "FAIL run $i: launch.sh printed an error of its own:"
    echo "$bad"
    failures=$((failures + 1))
  fi
done
if [ -n "${model_of[1]:-}" ] && [ -n "${model_of[2]:-}" ] &&
   [ "${model_of[1]}" != "${model_of[2]}" ]; then
  echo "FAIL: two shards saved another model than one"; failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] && echo "OK: $runs runs, no stray errors, one model on 1 and 2 shards"
exit $((failures > 0))
