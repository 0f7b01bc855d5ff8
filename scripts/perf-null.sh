#!/usr/bin/env bash
# The exchange alone, as on a GPU host where compute costs next to nothing:
# dp-ps and N dp-workers with the benchmark backend that does no arithmetic
# (--backend=null: a fixed gradient at once), N = 1, 2, 4, 8, over shared
# memory and gRPC, next to the floor measured in the same run: dp-ps's update
# alone for that N (exchange_bench --update_only, dp-ps's thread count).
# One table of medians over the repeats; the jobs of one repeat run one
# after another, each configuration once, so drift hits them alike.
# Synthetic data, batch 1 per worker: the null step does not depend on the
# batch (the gradient is the model's size), and at batch 1 rank 0's test
# evaluation at an epoch's end (1000 samples) comes at most every 125 steps.
# Not a test: prints numbers. Called by scripts/perf.sh; cheap on its own.
# Usage: scripts/perf-null.sh [repeats, default 3] [steps, default 500]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
steps=${2:-500}
TARGETS="dp-ps dp-worker exchange_bench" scripts/build.sh >/dev/null
# shellcheck source=scripts/perf-lib.sh
. scripts/perf-lib.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/dp-perf-null-XXXXXX")
trap 'rm -rf "$work"' EXIT
sizes="1 2 4 8"
planes="shm shm-park shm-call shm-2shards grpc"

ratio() { calc "%.2fx" "a / b" "$1" "$2"; }  # a / b as "1.23x"

# One job; appends to $work/$plane-$n one line: step_ms compute_ms
# exchange_ms update_ms wait_ms read_ms shm_ms (step: dp-ps's wall time per
# step from its first update to its last; the rest per step: rank 0's
# compute and exchange, dp-ps's update, rank 0's push to published update,
# dp-ps's reading of the pushes and its write into shared memory).
job() {
  local plane=$1 n=$2 dir ps w rate v values=() flags
  # shm-call: the same memory, with a PushPull call per step instead of the
  # step channel; shm-park: the step channel, the workers' waits sleeping at
  # once instead of spinning first (--spin_us); shm-2shards: shm on two
  # dp-ps shards (each shard's step through its own channel).
  case $plane in
    shm-2shards) flags=(--shards 2 --worker_flag=--data_plane=shm) ;;
    shm-call) flags=(--worker_flag=--data_plane=shm --worker_flag=--step_channel=false) ;;
    shm-park) flags=(--worker_flag=--data_plane=shm --worker_flag=--spin_us=0) ;;
    *) flags=(--worker_flag=--data_plane="$plane") ;;
  esac
  if ! dir=$(launch_run "null $plane N=$n" --workers "$n" --backend null \
               "${flags[@]}" --dataset=synthetic \
               --batch_size=1 --epochs=100000 --max_steps="$steps"); then
    echo "- - - - - - -" >>"$work/$plane-$n"
    return
  fi
  ps=$(cat "$dir/dp-ps.log")
  # dp-ps's default update threads, for the floor.
  v=$(field 's/.*the update runs on \([0-9]*\) thread.*/\1/p' "$ps")
  [ -z "$v" ] || echo "$v" >"$work/threads"
  w=$(grep "finished at step" "$dir/worker-0.log" || true)
  rate=$(field 's/.* \([0-9.]*\) samples\/s while training.*/\1/p' "$ps")
  for v in \
    "$(calc "%.4f" "1000 * a / b" "$n" "${rate:--}")" \
    "$(field 's/.*, \([0-9.]*\) ms compute.*/\1/p' "$w")" \
    "$(field 's/.* + \([0-9.]*\) ms exchange.*/\1/p' "$w")" \
    "$(field 's/.*per step: update \([0-9.]*\) ms.*/\1/p' "$ps")" \
    "$(field 's/.*rank 0 \([0-9.]*\) ms.*/\1/p' "$ps")" \
    "$(field 's/.*reading pushes \([0-9.]*\) ms.*/\1/p' "$ps")" \
    "$(field 's/.*into shared memory \([0-9.]*\) ms.*/\1/p' "$ps")"; do
    values+=("${v:--}")
  done
  echo "${values[*]}" >>"$work/$plane-$n"
  rm -rf "$dir"
}

echo 1 >"$work/threads"
for ((i = 1; i <= repeats; i++)); do
  for n in $sizes; do
    for plane in $planes; do job "$plane" "$n"; done
  done
  # With the threads dp-ps chose in its jobs (all the same: the model's
  # size decides).
  threads=$(cat "$work/threads")
  build/bench/exchange_bench --update_only="$threads" >>"$work/floor"
done

declare -A med  # med[plane-n,column]
for n in $sizes; do
  med[floor-$n]=$(awk -v n="$n" '$1 == n {print $2}' "$work/floor" | median)
  for plane in $planes; do
    for c in 1 2 3 4 5 6 7; do
      med[$plane-$n,$c]=$(awk -v c="$c" '{print $c}' "$work/$plane-$n" | median)
    done
  done
done

echo "== null compute: the step is the exchange (--backend=null, synthetic, batch 1,"
echo "   $steps steps, dp-ps's update on $threads thread(s)), median of $repeats runs"
row() { printf "%-3s %8s | %8s %8s %7s | %8s %8s %7s | %7s %8s %8s %8s\n" "$@"; }
row "" "floor" "" "shm" "" "" "gRPC" "" "gRPC" "shm-call" "shm-park" "2 shards"
row N "ms" "step ms" "update" "/floor" "step ms" "update" "/floor" "/shm" "/shm" "/shm" "/shm"
for n in $sizes; do
  row "$n" "${med[floor-$n]}" \
    "${med[shm-$n,1]}" "${med[shm-$n,4]}" "$(ratio "${med[shm-$n,1]}" "${med[floor-$n]}")" \
    "${med[grpc-$n,1]}" "${med[grpc-$n,4]}" "$(ratio "${med[grpc-$n,1]}" "${med[floor-$n]}")" \
    "$(ratio "${med[grpc-$n,1]}" "${med[shm-$n,1]}")" \
    "$(ratio "${med[shm-call-$n,1]}" "${med[shm-$n,1]}")" \
    "$(ratio "${med[shm-park-$n,1]}" "${med[shm-$n,1]}")" \
    "$(ratio "${med[shm-2shards-$n,1]}" "${med[shm-$n,1]}")"
done
echo "floor: dp-ps's update alone for N (average of N gradients + Adam; exchange_bench"
echo "  --update_only=$threads, warm caches). step ms: dp-ps's wall time per step, first"
echo "  update to last. update: dp-ps's update per step in the job. /floor: step over floor."
echo "  shm-park: the workers' step channel waits sleep at once instead of spinning first."
echo "  2 shards: shm on two dp-ps shards (shard 0's step time) over shm on one."
echo
echo "rank 0's step in parts (medians, ms per step): compute (batch gather + the null"
echo "  backend's fill of the gradient), exchange (push, barrier, new weights), and on"
echo "  dp-ps the wait from rank 0's push to the published update (update included),"
echo "  the reading of every rank's push (checked and summed as read) and the write of"
echo "  the new weights into shared memory; what exchange has beyond wait + shm is the"
echo "  control call (gRPC, its threads, the kernel's wake-ups)"
row2() { printf "%-3s | %8s %8s %8s %8s %8s | %8s %8s %8s %8s\n" "$@"; }
row2 "" "shm" "" "" "" "" "gRPC" "" "" ""
row2 N compute exchange wait read shm compute exchange wait read
for n in $sizes; do
  row2 "$n" "${med[shm-$n,2]}" "${med[shm-$n,3]}" "${med[shm-$n,5]}" \
    "${med[shm-$n,6]}" "${med[shm-$n,7]}" \
    "${med[grpc-$n,2]}" "${med[grpc-$n,3]}" "${med[grpc-$n,5]}" "${med[grpc-$n,6]}"
done
echo
echo "ratios: N=2 shm step/floor $(ratio "${med[shm-2,1]}" "${med[floor-2]}") (target <= 1.5x);" \
  "N=8 shm step/floor $(ratio "${med[shm-8,1]}" "${med[floor-8]}") (target <= 2.5x);" \
  "N=2 gRPC/shm $(ratio "${med[grpc-2,1]}" "${med[shm-2,1]}");" \
  "N=2 shm-call/shm $(ratio "${med[shm-call-2,1]}" "${med[shm-2,1]}");" \
  "N=2 shm-park/shm $(ratio "${med[shm-park-2,1]}" "${med[shm-2,1]}")"
