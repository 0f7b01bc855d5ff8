#!/usr/bin/env bash
# The straggler benchmark: 4 CPU workers on this machine train Fashion-MNIST
# (4 micro-batches of 32 a step); in two of the three setups one worker is
# stopped in bursts (SIGSTOP for STOP_MS, then SIGCONT for RUN_MS, over and
# over) - a throttled or preempted node. Prints samples/s (dp-ps's own
# count while training) with straggler backups on (the default,
# --backup_blocks=1) and off (--backup_blocks=0), and without a straggler:
# the median of `repeats` runs each, the setups alternated, and each as a
# ratio to the no-straggler median of this run. The lease is long
# (--worker_timeout_s=600): the stopped worker is never declared lost, so
# only the backups keep the steps going. Not a test: prints numbers, and the
# sha256 of each run's model (one value: who computed what does not matter).
# Usage: scripts/straggler-bench.sh [repeats, default 3] [steps, default 1500]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
steps=${2:-1500}
STOP_MS=${STOP_MS:-300}
RUN_MS=${RUN_MS:-300}
BIN=${BIN:-build}
[ -x "$BIN/server/dp-ps" ] || scripts/build.sh >/dev/null
# shellcheck source=scripts/perf-lib.sh
. scripts/perf-lib.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/dp-straggler-XXXXXX")
trap 'rm -rf "$work"' EXIT

# run NAME STRAGGLE(0|1) [dp-ps flags...]: prints samples/s and the model's
# sha256 prefix.
run() {
  local name=$1 straggle=$2
  shift 2
  local dir="$work/$name"
  start_job "$BIN" "$dir" 4 --batch_size=32 --max_steps="$steps" \
    --worker_timeout_s=600 --final_eval_timeout_s=1 "$@"
  local ps=${JOB_PIDS[0]} slow=${JOB_PIDS[4]}
  if [ "$straggle" = 1 ]; then
    # Bursts start once the job runs (the first step is in).
    until grep -q 'step [1-9]' "$dir/ps.log" || ! kill -0 "$ps" 2>/dev/null; do
      sleep 0.05
    done
    while kill -0 "$ps" 2>/dev/null; do
      kill -STOP "$slow" 2>/dev/null || true
      sleep "$(awk "BEGIN{print $STOP_MS/1000}")"
      kill -CONT "$slow" 2>/dev/null || true
      sleep "$(awk "BEGIN{print $RUN_MS/1000}")"
    done
  fi
  finish_job "$dir"
}

declare -A rates
declare -A shas
setups=(none on off)
for i in $(seq "$repeats"); do
  for s in "${setups[@]}"; do
    case $s in
      none) out=$(run "$s-$i" 0) ;;
      on) out=$(run "$s-$i" 1 --backup_blocks=1) ;;
      off) out=$(run "$s-$i" 1 --backup_blocks=0) ;;
    esac
    rates[$s]+="${out%% *} "
    shas[${out##* }]=1
    echo "run $i $s: ${out%% *} samples/s" >&2
  done
done
base=$(echo "${rates[none]}" | tr ' ' '\n' | grep . | median)
echo "4 workers x 32, $steps steps, one worker stopped ${STOP_MS} ms of every $((STOP_MS + RUN_MS)) ms; median of $repeats"
printf '%-34s %12s %8s\n' setup samples/s ratio
for s in "${setups[@]}"; do
  m=$(echo "${rates[$s]}" | tr ' ' '\n' | grep . | median)
  case $s in
    none) label="no straggler" ;;
    on) label="straggler, backups on (default)" ;;
    off) label="straggler, backups off" ;;
  esac
  printf '%-34s %12.0f %8.2f\n' "$label" "$m" "$(awk "BEGIN{print $m/$base}")"
done
echo "model sha256 prefixes: ${!shas[*]}"
