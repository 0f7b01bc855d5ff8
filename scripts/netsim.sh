#!/usr/bin/env bash
# A simulated cluster network on this machine: each host (a dp-ps shard, a
# worker) in its own network namespace, all joined through a bridge that
# lives in a "switch" namespace of its own, each host's link rate-limited
# with tc's tbf in both directions. Nothing is added to the root namespace,
# and a host has only its subnet route, so it can reach the other hosts and
# its own loopback, nothing else.
#
# Usage (as root):
#   scripts/netsim.sh up NAME HOSTS RATE  # namespaces NAME-sw, NAME-h0..NAME-h{HOSTS-1}
#   scripts/netsim.sh down NAME           # removes them (idempotent)
#   scripts/netsim.sh exec NAME I CMD...  # runs CMD in host I's namespace
#   scripts/netsim.sh addr NAME I         # host I's address, e.g. 10.77.0.1
#   scripts/netsim.sh bytes NAME I        # "TX RX": bytes host I's link sent and received
#   scripts/netsim.sh list                # the nets that exist (their NAMEs)
#
# RATE is a tc rate (50mbit, 1gbit). Host I is 10.77.0.(I+1)/24 on its
# interface eth0; every net uses the same subnet, which exists only inside
# its own namespaces, so nets never see each other. NAME must be unique per
# run (include the PID, e.g. dpnet-$$) so that parallel runs do not collide;
# `up` refuses a NAME that exists. A failing or interrupted `up` removes what
# it created. Callers remove the net when they end, however they end:
#   trap 'scripts/netsim.sh down "$NAME"' EXIT
#   trap 'exit 130' INT TERM   # so that a signal ends the caller through EXIT
# (SIGKILL cannot be trapped: `list` shows what is left, `down` removes it.)
# `down` also stops the processes still running in the net's namespaces.
set -euo pipefail

SUBNET=10.77.0
MAX_HOSTS=250

die() { echo "netsim: $*" >&2; exit 2; }

need_tools() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, veth, tc)"
  command -v ip >/dev/null 2>&1 || die "ip not found: install iproute2"
  command -v tc >/dev/null 2>&1 || die "tc not found: install iproute2"
}

check_name() {
  [[ "$1" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$ ]] ||
    die "bad NAME '$1' (letters, digits, _ . -; at most 40 characters)"
}

check_host() {  # NAME I
  [[ "$2" =~ ^[0-9]+$ ]] || die "bad host index '$2'"
  ns_exists "$1-h$2" || die "no host $2 in net $1"
}

ns_exists() { [ -e "/run/netns/$1" ]; }

# The namespaces of net NAME: NAME-sw and NAME-hI.
net_namespaces() {
  local name=$1 ns
  for ns in $(ip netns list | awk '{print $1}'); do
    case "$ns" in
      "$name-sw") echo "$ns" ;;
      "$name"-h*) [[ "${ns#"$name"-h}" =~ ^[0-9]+$ ]] && echo "$ns" ;;
    esac
  done
  return 0
}

# Token bucket for RATE (tc syntax) in one direction of one link.
#   burst: 64 KiB (a whole GSO packet, so tbf need not split the segments
#   veth hands it), or 2 ms at RATE when that is more, so the shaper keeps
#   the rate when its timer fires late on a busy machine;
#   latency 20 ms: the queue in front of the bucket (rate * 20 ms + burst);
#   beyond it packets drop, as at a real switch port, and TCP backs off.
add_shaper() {  # NS DEV RATE
  local bps burst
  bps=$(rate_bits "$3")
  burst=$((bps / 8 / 500))
  [ "$burst" -ge 65536 ] || burst=65536
  tc -n "$1" qdisc replace dev "$2" root tbf rate "$3" burst "$burst" latency 20ms
}

# A tc rate (e.g. 50mbit, 1gbit, 1.5gbit, 100kbit, 1000000bit) in bits/s.
rate_bits() {
  local r=${1,,} num unit
  [[ "$r" =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit)$ ]] ||
    die "bad RATE '$1' (e.g. 50mbit, 1gbit)"
  num=${BASH_REMATCH[1]} unit=${BASH_REMATCH[3]}
  case "$unit" in
    bit) awk -v n="$num" 'BEGIN{printf "%d", n}' ;;
    kbit) awk -v n="$num" 'BEGIN{printf "%d", n * 1e3}' ;;
    mbit) awk -v n="$num" 'BEGIN{printf "%d", n * 1e6}' ;;
    gbit) awk -v n="$num" 'BEGIN{printf "%d", n * 1e9}' ;;
  esac
}

# IPv4 only: without this every link would get an IPv6 link-local address
# and send neighbour discovery on its own, adding to the byte counters.
no_ipv6() {  # NS, before its interfaces exist
  ip netns exec "$1" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 &&
    echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6'
}

cmd_down() {
  local name=$1 ns pids left
  check_name "$name"
  local namespaces
  namespaces=$(net_namespaces "$name")
  [ -n "$namespaces" ] || return 0
  # Processes left in the net keep its namespaces (and links) alive after
  # `ip netns del`: stop them first, TERM then KILL, bounded.
  for sig in TERM KILL; do
    pids=""
    for ns in $namespaces; do pids+=" $(ip netns pids "$ns" 2>/dev/null || true)"; done
    pids=$(echo $pids)
    [ -n "$pids" ] || break
    kill -s "$sig" $pids 2>/dev/null || true
    for _ in $(seq 50); do
      left=""
      for p in $pids; do kill -0 "$p" 2>/dev/null && left+=" $p"; done
      [ -n "$left" ] || break
      sleep 0.1
    done
  done
  # Deleting a namespace deletes its veth ends, and with them their peers.
  for ns in $namespaces; do ip netns del "$ns" 2>/dev/null || true; done
  left=$(net_namespaces "$name")
  [ -z "$left" ] || die "could not remove: $left"
}

cmd_up() {
  local name=$1 hosts=$2 rate=$3 i ns
  check_name "$name"
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le $MAX_HOSTS ] ||
    die "HOSTS must be 1..$MAX_HOSTS, got '$hosts'"
  rate_bits "$rate" >/dev/null
  [ -z "$(net_namespaces "$name")" ] || die "net $name exists (names must be unique per run)"

  # From here on, a failure (set -e) or a signal removes what was created.
  trap 'echo "netsim: up $name failed or was interrupted, removing it" >&2; cmd_down "$name"' EXIT
  trap 'exit 130' INT TERM

  local sw="$name-sw"
  ip netns add "$sw"
  no_ipv6 "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < hosts; i++)); do
    ns="$name-h$i"
    ip netns add "$ns"
    no_ipv6 "$ns"
    ip -n "$ns" link set lo up
    # Both ends are born in their namespaces: the pair never touches the
    # root namespace. pI (switch side) <-> eth0 (host side).
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    add_shaper "$ns" eth0 "$rate"   # what host i sends
    add_shaper "$sw" "p$i" "$rate"  # what host i receives
  done
  trap - EXIT INT TERM
  echo "netsim: up $name: $hosts hosts at $rate each, $SUBNET.1-$SUBNET.$hosts"
}

cmd_bytes() {
  local ns="$1-h$2"
  # `ip netns exec` mounts the namespace's own /sys.
  ip netns exec "$ns" sh -c \
    'echo "$(cat /sys/class/net/eth0/statistics/tx_bytes) $(cat /sys/class/net/eth0/statistics/rx_bytes)"'
}

usage() { sed -n '9,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 1 ] || usage
sub=$1; shift
case "$sub" in
  up) [ $# -eq 3 ] || usage; need_tools; cmd_up "$@" ;;
  down) [ $# -eq 1 ] || usage; need_tools; cmd_down "$1" ;;
  exec)
    [ $# -ge 3 ] || usage; need_tools; check_name "$1"; check_host "$1" "$2"
    ns="$1-h$2"; shift 2
    exec ip netns exec "$ns" "$@" ;;
  addr) [ $# -eq 2 ] || usage; check_name "$1"; [[ "$2" =~ ^[0-9]+$ ]] || die "bad host index '$2'"
    echo "$SUBNET.$(($2 + 1))" ;;
  bytes) [ $# -eq 2 ] || usage; need_tools; check_name "$1"; check_host "$1" "$2"; cmd_bytes "$1" "$2" ;;
  list) need_tools; ip netns list | awk '{print $1}' | sed -n 's/-sw$//p' ;;
  *) usage ;;
esac
