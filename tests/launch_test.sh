#!/usr/bin/env bash
# scripts/launch.sh as a user runs it: a short synthetic job must end with
# exit 0, and everything it prints must be launch's or dp-ps's own lines (no
# error from the script itself, such as a poll reading dp-ps's log before the
# log exists).
# Usage: launch_test.sh BUILD_DIR [runs]
set -uo pipefail
build=$1
runs=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
failures=0
export TMPDIR=$(mktemp -d)  # launch.sh's run directories, removed at the end
trap 'rm -rf "$TMPDIR"' EXIT
for ((i = 1; i <= runs; i++)); do
  out=$(BIN=$build "$here/scripts/launch.sh" --workers 2 --dataset=synthetic \
        --max_steps=3 --batch_size=8 2>&1)
  code=$?
  if [ "$code" -ne 0 ]; then
    echo "FAIL run $i: launch.sh exited $code"; failures=$((failures + 1))
  fi
  # The script's own complaints and the shell's: "sed: ...", "line N: ...".
  bad=$(grep -E '^(sed|tee|head|seq|kill|mktemp):|No such file|line [0-9]+:' <<<"$out")
  if [ -n "$bad" ]; then
    echo "FAIL run $i: launch.sh printed an error of its own:"
    echo "$bad"
    failures=$((failures + 1))
  fi
done
[ "$failures" -eq 0 ] && echo "OK: $runs runs, no stray errors"
exit $((failures > 0))
