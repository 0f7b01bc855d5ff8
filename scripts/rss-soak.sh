#!/usr/bin/env bash
# shellcheck disable=SC2154  # the variables of the flags: set by take_flags
# Runs one dp-ps and N dp-workers (loopback), samples every process's resident
# memory (VmRSS, and the peak VmHWM) from /proc while they train, and reports
# each one's RSS once the first fifth of the run is behind it (the warm-up:
# buffers, thread pools and arenas in place), at the end, the growth between
# the two, and the peak. Fails when any process grew by more than
# --max_growth_mb, or when a process fails.
#
# Usage: scripts/rss-soak.sh [--workers N] [--backend cpu|cuda|auto]
#                            [--data_dir DIR] [--interval SECONDS]
#                            [--max_growth_mb MB] [any other dp-ps flag ...]
# Defaults: 2 workers, the CPU backend, --dataset=synthetic --epochs=100000
# --max_steps=10000 (10,000 steps of 2 x 64 samples),
# samples every 0.5 s, growth limit 1 MB. The samples are kept as
# rss.tsv (seconds, then kB per process) in the run directory it names.
# Example (the Fashion-MNIST peak of each process over one epoch):
#   scripts/rss-soak.sh --dataset=fashion-mnist --epochs=1 --max_steps=0
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/job-lib.sh
BIN=${BIN:-build}
take_flags workers=2 backend=cpu data_dir= interval=0.5 max_growth_mb=1 \
  -- "$@"
# Later flags win over the defaults.
ps_args=(--dataset=synthetic --epochs=100000 --max_steps=10000 "${other_args[@]}")

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/dp-soak-XXXXXX")
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap 'echo "rss-soak: interrupted"; stop_all; exit 130' INT TERM

"$BIN/server/dp-ps" --host=127.0.0.1 --port=0 --workers="$workers" \
  "${ps_args[@]}" >"$run_dir/dp-ps.log" 2>&1 &
pids+=("$!")
names=(dp-ps)
port=$(ps_port "$run_dir/dp-ps.log" "${pids[0]}")
if [ -z "$port" ]; then
  echo "rss-soak: dp-ps did not start (log: $run_dir/dp-ps.log)" >&2
  stop_all
  exit 1
fi
for ((r = 0; r < workers; r++)); do
  "$BIN/worker/dp-worker" --ps="127.0.0.1:$port" --rank="$r" \
    --backend="$backend" ${data_dir:+--data_dir="$data_dir"} \
    >"$run_dir/worker-$r.log" 2>&1 &
  pids+=("$!")
  names+=("worker-$r")
done
echo "${pids[*]}" >"$run_dir/pids"  # dp-ps, then the workers by rank
echo "rss-soak: dp-ps on port $port, $workers workers; logs in $run_dir"

# field NAME of /proc/PID/status in kB, empty once the process is gone
status_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null; }

declare -a hwm
: >"$run_dir/rss.tsv"
start=$(date +%s.%N)
while :; do
  alive=0
  line=$(awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  for i in "${!pids[@]}"; do
    rss=$(status_kb "${pids[$i]}" VmRSS)
    if [ -n "$rss" ]; then
      alive=1
      h=$(status_kb "${pids[$i]}" VmHWM)
      [ -n "$h" ] && hwm[$i]=$h
    fi
    line+=$'\t'"${rss:--}"
  done
  [ "$alive" -eq 1 ] || break
  echo "$line" >>"$run_dir/rss.tsv"
  sleep "$interval"
done

failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  code=$?
  if [ "$code" -ne 0 ]; then
    echo "rss-soak: ${names[$i]} exited with code $code" >&2
    failed=1
  fi
done
grep -h "final test accuracy\|finished at step" "$run_dir"/*.log | sed 's/^/  /'

# Per process: the first sample at or after a fifth of its lifetime, the
# last one, and the peak.
printf '%-10s %12s %12s %12s %12s\n' process "RSS@1/5 MB" "RSS@end MB" \
  "growth MB" "VmHWM MB"
for i in "${!pids[@]}"; do
  col=$((i + 2))
  read -r warm last grown < <(awk -F'\t' -v c="$col" '
    $c != "-" { t[n] = $1; v[n] = $c; n++ }
    END {
      if (n == 0) { print "0 0 0"; exit }
      w = v[0]; for (k = 0; k < n; k++) if (t[k] - t[0] >= (t[n-1] - t[0]) / 5) { w = v[k]; break }
      print w, v[n-1], v[n-1] - w
    }' "$run_dir/rss.tsv")
  printf '%-10s %12.1f %12.1f %+12.1f %12.1f\n' "${names[$i]}" \
    "$(echo "$warm / 1024" | bc -l)" "$(echo "$last / 1024" | bc -l)" \
    "$(echo "$grown / 1024" | bc -l)" "$(echo "${hwm[$i]:-0} / 1024" | bc -l)"
  if [ "$(echo "$grown > $max_growth_mb * 1024" | bc)" -eq 1 ]; then
    echo "rss-soak: ${names[$i]} grew by more than $max_growth_mb MB" >&2
    failed=1
  fi
done
exit "$failed"
