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
