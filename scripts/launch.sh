#!/usr/bin/env bash
# shellcheck disable=SC2154  # the variables of the flags: set by take_flags
# Runs one dp-ps and N dp-workers on this machine (loopback), shows dp-ps's
# progress (epoch, step/total, loss, samples/s, ETA) and the test accuracy.
# Stops everything on Ctrl-C or on the first process that fails.
#
# Usage: scripts/launch.sh [--workers N] [--shards K] [--backend auto|cpu|cuda]
#                          [--data_dir DIR] [--metrics_port P]
#                          [--worker_flag=FLAG ...] [--rusage]
#                          [any other dp-ps flag ...]
# --shards K (default 1): K dp-ps shards (docs/sharding.md), each with the
# other dp-ps flags; shard 0 logs to dp-ps.log and shows the progress,
# shard k to dp-ps-k.log; the workers get every shard's address.
# --backend (default auto): the workers' backend. With GPUs, worker r runs on
# GPU r modulo their number, so each worker has its own while there are
# enough.
# --metrics_port P serves Prometheus metrics on 127.0.0.1: dp-ps on P, worker
# r on P+1+r (deploy/prometheus/prometheus.yml scrapes P=9400, 2 workers).
# --worker_flag=FLAG (repeatable) passes FLAG to every worker, e.g.
# --worker_flag=--threads=2.
# --rusage runs each process under GNU time (package `time`), which writes the
# kernel's account of the process when it ends (wait4: CPU time to the last
# tick, peak RSS) to <run dir>/<process>.rusage as one line
# "elapsed_s user_s system_s max_rss_kb". Sampling /proc/<pid>/stat instead
# would miss what happens after the last sample (the final evaluation, the
# shutdown), and a zombie's /proc no longer has VmHWM.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/job-lib.sh
BIN=${BIN:-build}
take_flags workers=2 shards=1 backend=auto data_dir= metrics_port=0 \
  'worker_flag[]' -- "$@"
rusage=false
ps_args=()
for arg in "${other_args[@]}"; do
  case "$arg" in
    --rusage) rusage=true ;;
    *) ps_args+=("$arg") ;;
  esac
done

case "$metrics_port" in
  '' | *[!0-9]*) echo "launch: --metrics_port must be a port number, got '$metrics_port'" >&2; exit 2 ;;
esac
case "$shards" in
  '' | *[!0-9]* | 0) echo "launch: --shards must be a number of shards (1 or more), got '$shards'" >&2; exit 2 ;;
esac
if [ "$shards" -gt 1 ] && [ "$metrics_port" -gt 0 ]; then
  echo "launch: --metrics_port serves one dp-ps; with --shards=$shards, leave it out" >&2
  exit 2
fi

if $rusage && [ ! -x /usr/bin/time ]; then
  echo "launch: --rusage needs GNU time (/usr/bin/time, Debian package time)" >&2
  exit 2
fi
# stop_all signals GNU time's child with pkill: without it, time itself
# would die, and its child run on with no account written.
if $rusage && ! command -v pkill >/dev/null 2>&1; then
  echo "launch: --rusage needs pkill (Debian package procps)" >&2
  exit 2
fi

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/dp-run-XXXXXX")
pids=()
stop_all() {
  for p in "${pids[@]}"; do
    # Under --rusage, $p is GNU time, which does not pass signals on: signal
    # its child, and time ends with it and writes its account.
    if $rusage && pkill -TERM -P "$p" 2>/dev/null; then continue; fi
    kill "$p" 2>/dev/null
  done
  wait 2>/dev/null
}
measured() {  # measured NAME COMMAND...: runs COMMAND, under GNU time with --rusage
  local name=$1
  shift
  if $rusage; then
    exec /usr/bin/time -o "$run_dir/$name.rusage" -f "%e %U %S %M" "$@"
  fi
  exec "$@"
}
trap 'echo "launch: interrupted, stopping all processes"; stop_all; exit 130' INT TERM

metrics_flags() {  # the metrics flags of dp-ps (offset 0) or worker r (1+r)
  [ "$metrics_port" -gt 0 ] || return 0
  echo "--metrics_host=127.0.0.1 --metrics_port=$((metrics_port + $1))"
}

declare -A name_of
# Shards 1..K-1 first: shard 0 needs their addresses. Each picks a free
# port and says which.
others=""
shard_flags=()
for ((k = 1; k < shards; k++)); do
  : >"$run_dir/dp-ps-$k.log"
  measured "dp-ps-$k" "$BIN/server/dp-ps" --host=127.0.0.1 --port=0 \
    --workers="$workers" --shards="$shards" --shard="$k" "${ps_args[@]}" \
    >"$run_dir/dp-ps-$k.log" 2>&1 &
  pids+=("$!")
  name_of[$!]="dp-ps shard $k"
  p=$(ps_port "$run_dir/dp-ps-$k.log" "$!")
  if [ -z "$p" ]; then
    echo "launch: dp-ps shard $k did not start (log: $run_dir/dp-ps-$k.log)" >&2
    stop_all
    exit 1
  fi
  others+="${others:+,}127.0.0.1:$p"
done
[ "$shards" -gt 1 ] &&
  shard_flags=(--shards="$shards" --shard=0 --shard_addresses="$others")

# The log exists before dp-ps starts: tee creates it only once it runs, and
# the poll below must not read a file that is not there yet.
: >"$run_dir/dp-ps.log"
measured dp-ps "$BIN/server/dp-ps" --host=127.0.0.1 --port=0 --workers="$workers" \
  $(metrics_flags 0) "${shard_flags[@]}" "${ps_args[@]}" \
  > >(tee "$run_dir/dp-ps.log") 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
name_of[$ps_pid]=dp-ps

port=$(ps_port "$run_dir/dp-ps.log" "$ps_pid")
if [ -z "$port" ]; then
  echo "launch: dp-ps did not start (log: $run_dir/dp-ps.log)" >&2
  stop_all
  exit 1
fi
ps_list="127.0.0.1:$port${others:+,$others}"

# GPUs this machine shows (0 without a driver); the CPU backend needs none.
gpus=0
if [ "$backend" != cpu ] && command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
device_flag() {  # worker $1's GPU, when there are GPUs
  [ "$gpus" -gt 0 ] && echo "--device=$(($1 % gpus))"
}

for ((r = 0; r < workers; r++)); do
  measured "worker-$r" "$BIN/worker/dp-worker" --ps="$ps_list" \
    --rank="$r" --backend="$backend" $(device_flag "$r") \
    ${data_dir:+--data_dir="$data_dir"} \
    $(metrics_flags $((r + 1))) "${worker_flag[@]}" \
    > "$run_dir/worker-$r.log" 2>&1 &
  pids+=("$!")
  name_of[$!]="worker $r"
done
on_gpus=""
[ "$gpus" -gt 0 ] && on_gpus=" on $gpus GPUs"
on_shards=""
[ "$shards" -gt 1 ] && on_shards=" (shard 0 of $shards; the others on $others)"
echo "launch: dp-ps on port $port$on_shards, $workers workers$on_gpus; logs in $run_dir"

# Reap processes as they end; the first failure stops the others.
remaining=${#pids[@]}
while [ "$remaining" -gt 0 ]; do
  wait -n -p done_pid
  code=$?
  remaining=$((remaining - 1))
  if [ "$code" -ne 0 ]; then
    name=${name_of[$done_pid]:-process}
    echo "launch: $name exited with code $code; stopping the others" >&2
    case "$name" in
      worker*) tail -n 20 "$run_dir/worker-${name#worker }.log" >&2 ;;
      "dp-ps shard"*) tail -n 20 "$run_dir/dp-ps-${name#dp-ps shard }.log" >&2 ;;
    esac
    stop_all
    exit "$code"
  fi
done
echo "launch: all processes finished; logs in $run_dir"
