# shellcheck shell=bash
# Helpers of scripts/perf.sh and scripts/perf-null.sh (sourced, not run).
# Numbers that were not measured, or whose run failed, are "-" and stay "-".

median() {  # median of the numbers on stdin, "-" when none
  { grep -E '^[0-9.]+$' || true; } | sort -n | awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : "-"}'
}
calc() {  # calc FORMAT EXPR VALUES...: EXPR over a, b, c, "-" if any is "-"
  local format=$1 expr=$2
  shift 2
  for v in "$@"; do [ -z "$v" ] || [ "$v" = - ] && { echo -; return; }; done
  local out
  out=$(awk -v a="${1:-0}" -v b="${2:-0}" -v c="${3:-0}" \
          "BEGIN {printf \"$format\", $expr}" 2>/dev/null) || out=-
  case "$out" in *inf* | *nan*) out=- ;; esac  # a division by zero
  echo "$out"
}
field() { sed -n "$1" <<<"$2" | head -1; }  # field SED_SCRIPT TEXT

# launch_run LABEL LAUNCH_ARGS...: one job of scripts/launch.sh with the
# build tree's binaries; prints its run directory (logs: dp-ps.log,
# worker-R.log), or says on stderr that LABEL failed, with the end of its
# output, and returns 1.
launch_run() {
  local label=$1 out
  shift
  if ! out=$(BIN=build scripts/launch.sh "$@" 2>&1); then
    echo "perf: $label failed:" >&2
    tail -n 5 <<<"$out" >&2
    return 1
  fi
  field 's/^launch: all processes finished; logs in //p' "$out"
}

# start_job BIN DIR WORKERS [dp-ps flags...]: dp-ps of build directory BIN
# on a free loopback port (its model saved to DIR/model.safetensors) and
# WORKERS CPU workers, logs in DIR; JOB_PIDS holds dp-ps's pid, then the
# workers'. finish_job waits for them: call both in the same shell.
start_job() {
  local bin=$1 dir=$2 workers=$3 port="" r
  shift 3
  rm -rf "$dir" && mkdir -p "$dir"
  "$bin/server/dp-ps" --host=127.0.0.1 --port=0 --health_port=-1 \
    --metrics_port=0 --workers="$workers" \
    --save_model="$dir/model.safetensors" "$@" >"$dir/ps.log" 2>&1 &
  JOB_PIDS=("$!")
  for _ in $(seq 300); do
    port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$dir/ps.log" | cut -d: -f2 || true)
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$dir/ps.log" >&2; return 1; }
  for r in $(seq 0 $((workers - 1))); do
    "$bin/worker/dp-worker" --ps="127.0.0.1:$port" --rank="$r" --backend=cpu \
      >"$dir/w$r.log" 2>&1 &
    JOB_PIDS+=("$!")
  done
}

# finish_job DIR: waits for start_job's processes; prints dp-ps's samples/s
# while training and the first 16 hex digits of the model's sha256.
finish_job() {
  local dir=$1 p
  wait "${JOB_PIDS[0]}" || { tail -5 "$dir/ps.log" >&2; return 1; }
  for p in "${JOB_PIDS[@]:1}"; do wait "$p" || true; done
  echo "$(grep -o '[0-9]* samples/s while training' "$dir/ps.log" | cut -d' ' -f1)" \
    "$(sha256sum "$dir/model.safetensors" | cut -c1-16)"
}
