# shellcheck shell=bash
# Helpers of scripts/launch.sh and scripts/rss-soak.sh (sourced, not run):
# their own flags, and the port of the dp-ps they start.

# take_flags FLAG... -- ARGS...: a script's own flags, each FLAG either
# NAME=DEFAULT (the shell variable NAME, set to DEFAULT) or NAME[] (the
# array NAME, empty). Each --NAME VALUE or --NAME=VALUE in ARGS then sets
# NAME to VALUE, or appends VALUE to the array NAME; every other word goes,
# in order, to the array other_args.
take_flags() {
  local _names=() _arrays=" " _name _value _n
  while [ "$1" != -- ]; do
    case "$1" in
      *'[]') _name=${1%'[]'}; _arrays+="$_name "; eval "$_name=()" ;;
      *=*) _name=${1%%=*}; printf -v "$_name" '%s' "${1#*=}" ;;
      *) echo "take_flags: $1 is neither NAME=DEFAULT nor NAME[]" >&2; return 2 ;;
    esac
    _names+=("$_name")
    shift
  done
  shift
  other_args=()
  while [ $# -gt 0 ]; do
    _name=""
    for _n in "${_names[@]}"; do
      case "$1" in
        "--$_n") _name=$_n; _value=$2; shift 2 ;;
        "--$_n="*) _name=$_n; _value=${1#*=}; shift ;;
        *) continue ;;
      esac
      break
    done
    if [ -z "$_name" ]; then
      other_args+=("$1")
      shift
    elif [[ "$_arrays" == *" $_name "* ]]; then
      eval "$_name+=(\"\$_value\")"
    else
      printf -v "$_name" '%s' "$_value"
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
