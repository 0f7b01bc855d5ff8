#!/usr/bin/env bash
# Two builds on the same job, alternated run by run on this machine: the
# default job (2 workers x 64, Fashion-MNIST, shared memory) for one epoch,
# samples/s while training (dp-ps's own count) and the saved model's sha256,
# the median of `repeats` runs each and the ratio new/old. For the cost of a
# change: build the old commit elsewhere (git worktree add ../old REV &&
# (cd ../old && scripts/build.sh)) and pass its build directory. Not a test:
# prints numbers.
# Usage: scripts/compare-builds.sh OLD_BUILD_DIR [NEW_BUILD_DIR=build]
#                                  [repeats, default 5] [dp-ps flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1
new=${2:-build}
repeats=${3:-5}
shift $(($# < 3 ? $# : 3))
# shellcheck source=scripts/perf-lib.sh
. scripts/perf-lib.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/dp-compare-XXXXXX")
trap 'rm -rf "$work"' EXIT

declare -A rates
declare -A shas
for i in $(seq "$repeats"); do
  for b in old new; do
    bin=$old
    [ "$b" = new ] && bin=$new
    out=$(start_job "$bin" "$work/$b" 2 --epochs=1 "$@" &&
      finish_job "$work/$b")
    rates[$b]+="${out%% *} "
    shas[$b]+="${out##* } "
    echo "run $i $b: ${out%% *} samples/s, model ${out##* }" >&2
  done
done
o=$(echo "${rates[old]}" | tr ' ' '\n' | grep . | median)
n=$(echo "${rates[new]}" | tr ' ' '\n' | grep . | median)
echo "default job (2 x 64, 1 epoch), median of $repeats alternated runs"
printf '%-6s %12s  %s\n' build samples/s models
printf '%-6s %12.0f  %s\n' old "$o" "$(echo "${shas[old]}" | tr ' ' '\n' | sort -u | tr '\n' ' ')"
printf '%-6s %12.0f  %s\n' new "$n" "$(echo "${shas[new]}" | tr ' ' '\n' | sort -u | tr '\n' ' ')"
printf 'new / old: %.2f\n' "$(awk "BEGIN{print $n/$o}")"
