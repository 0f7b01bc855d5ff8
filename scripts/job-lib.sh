# shellcheck shell=bash
# Helpers of scripts/launch.sh and scripts/rss-soak.sh (sourced, not run):
# their own flags, and the port of the dp-ps they start.

# take_flags NAME... -- ARGS...: each --NAME VALUE or --NAME=VALUE in ARGS
# whose NAME is listed sets the shell variable NAME to VALUE (appends, when
# that variable is an array); every other word goes, in order, to the array
# other_args.
take_flags() {
  local names=() name value n
  while [ "$1" != -- ]; do names+=("$1"); shift; done
  shift
  other_args=()
  while [ $# -gt 0 ]; do
    name=""
    for n in "${names[@]}"; do
      case "$1" in
        "--$n") name=$n; value=$2; shift 2 ;;
        "--$n="*) name=$n; value=${1#*=}; shift ;;
        *) continue ;;
      esac
      break
    done
    if [ -z "$name" ]; then
      other_args+=("$1")
      shift
    elif [[ "$(declare -p "$name" 2>/dev/null)" == "declare -a"* ]]; then
      eval "$name+=(\"\$value\")"
    else
      printf -v "$name" '%s' "$value"
    fi
  done
}

# ps_port LOG PID: the port that dp-ps (process PID, logging to LOG) says it
# listens on, once it says so; nothing when PID ends first or after 30 s.
ps_port() {
  local port=""
  for _ in $(seq 300); do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$1" | head -1)
    [ -n "$port" ] && break
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  echo "$port"
}
