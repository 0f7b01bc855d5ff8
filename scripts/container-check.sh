#!/usr/bin/env bash
# The container images built and run for real, with Podman: both CPU images
# from deploy/docker, built and run by the very commands docs/deploying.md
# shows (its blocks marked `<!-- container-check: NAME -->`, run as written,
# `docker` being Podman), then checked against the Kubernetes manifests:
#  - each container's user, read-only root, capabilities, privilege
#    escalation, limits, mounts and DP_* environment are what
#    deploy/k8s/overlays/cpu gives its pod;
#  - from the host, as a kubelet would: every gRPC probe the manifests
#    declare answers SERVING, every metrics port answers /metrics (the
#    workers' while the job is held: dp-ps paused once both have joined,
#    resumed once their probes are in, so the job lasts until they land);
#  - the job (dp-ps + 2 workers, Fashion-MNIST, 3 epochs) ends with every
#    worker exiting 0, a test accuracy of at least 0.8 and the model on the
#    state volume; the workers used gRPC (other network namespaces);
#  - the same job with dp-ps stopped (SIGTERM, as a drain) mid-job and
#    started again ends with a byte-identical model, no worker exiting
#    non-zero;
#  - the image sizes are within their targets (dp-ps 120 MB, worker 200 MB).
# Everything it makes (containers, network, volume, the images it tagged)
# is removed at the end, also on failure. Podman keeps its own store in
# /var/lib/dp-ps-container-check (the base images and the build cache, so
# that later runs are fast) and its configuration in a temporary directory:
# no host configuration file is changed.
#
# Base images: debian:12 and debian:12-slim from a registry when one is
# reachable, else made from Debian's mirror with debootstrap (minbase,
# with the slim image's dpkg and apt settings).
#
# Needs root. Exits 0 when every check passes; prints "SKIP: <reason>" and
# exits 0 only where the machine cannot make a container's namespaces.
# Usage: scripts/container-check.sh [BUILD_DIR]   (for tests/health_probe)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build_dir=$(cd "${1:-build}" && pwd)
probe=$build_dir/tests/health_probe
say() { echo "container-check: $*"; }
fail() { say "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "needs root (rootful Podman, as CI runs it)"
[ -x "$probe" ] || fail "$probe missing: build the target health_probe"

# ---------------------------------------------------------------- tools
# iptables: netavark runs it to set up the containers' network (without it
# the first container fails "netavark: No such file or directory").
packages=(podman runc netavark aardvark-dns iptables debootstrap curl python3-yaml)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install \
        -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
command -v kubectl >/dev/null || fail "kubectl missing (the header of scripts/setup.sh says where from)"

# ---------------------------------------------------------------- podman
# A store of its own (a cache across runs) and a configuration of its own.
state=/var/lib/dp-ps-container-check
mkdir -p "$state"
exec 9>"$state/lock"
flock -w 1800 9 || fail "another container check holds $state/lock"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/container-check-XXXXXX")
mkdir -p "$tmp/networks"
# runc: Debian's default crun cannot start containers in some sandboxes.
# Explicit limits: Podman's defaults (nofile 1048576, nproc the host's) are
# refused where the runtime may not raise a limit (here: nofile above the
# hard limit of this shell, nproc above 32768 of 96362).
nofile=$(ulimit -Hn)
nproc=32768
cat >"$tmp/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
network_config_dir = "$tmp/networks"
EOF
cat >"$tmp/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$state/storage"
runroot = "/run/dp-ps-container-check"
EOF
export CONTAINERS_CONF=$tmp/containers.conf
export CONTAINERS_STORAGE_CONF=$tmp/storage.conf
export CONTAINERS_REGISTRIES_CONF=$tmp/registries.conf
cat >"$tmp/registries.conf" <<EOF
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
EOF

# What docs/deploying.md calls `docker`. Builds use the host's network to
# reach the package mirror. Podman's --read-only also mounts tmpfs on /run,
# /var/tmp and /tmp, Docker's does not (nor does Kubernetes's
# readOnlyRootFilesystem): a container gets only what the command mounts.
docker() {
  case "$1" in
    build) shift; podman build --network=host "$@" ;;
    run) shift; podman run --read-only-tmpfs=false "$@" ;;
    *) podman "$@" ;;
  esac
}

# ---------------------------------------------------------------- cleanup
made_images=()
cleanup() {
  local code=$?
  set +e
  if [ "$code" -ne 0 ]; then  # what the containers said, for the failure
    for c in dp-ps-0 dp-worker-0 dp-worker-1; do
      podman container exists "$c" 2>/dev/null || continue
      echo "--- $c ($(podman inspect -f '{{.State.Status}}, exit {{.State.ExitCode}}' "$c")), last lines:"
      podman logs --tail 15 "$c" 2>&1
    done
  fi
  for c in dp-ps-0 dp-worker-0 dp-worker-1; do
    podman unpause "$c" >/dev/null 2>&1  # a failure while the job was held
    podman rm -f -t 0 "$c" >/dev/null 2>&1
  done
  podman network rm -f dp-ps >/dev/null 2>&1
  podman volume rm -f state-dp-ps-0 >/dev/null 2>&1
  for i in "${made_images[@]}"; do podman rmi -f "$i" >/dev/null 2>&1; done
  # The build cache of each source tree is an untagged image of about
  # 700 MB: keep a day's worth.
  podman image prune -f --filter until=24h >/dev/null 2>&1
  rm -rf "$tmp"
  if [ "$code" -ne 0 ]; then say "FAILED (exit $code)"; fi
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Left over by a run that was killed (SIGKILL cannot clean up).
for c in dp-ps-0 dp-worker-0 dp-worker-1; do podman rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
podman network rm -f dp-ps >/dev/null 2>&1 || true
podman volume rm -f state-dp-ps-0 >/dev/null 2>&1 || true

# ---------------------------------------------------------------- base images
slim_settings() {  # the apt and dpkg settings of Docker's debian:12(-slim)
  local root=$1
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
  printf 'Acquire::GzipIndexes "true";\nAcquire::CompressionTypes::Order:: "gz";\n' \
    >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
  echo 'APT::AutoRemove::SuggestsImportant "false";' \
    >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
    "$root"/var/cache/apt/archives/*.deb "$root"/var/log/*.log
}
slimify() {  # what debian:12-slim leaves out
  local root=$1
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/info/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
EOF
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/{info,groff,linda,lintian,man}/*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias \
    -exec rm -rf {} +
}
base_images() {
  if podman image exists docker.io/library/debian:12 &&
     podman image exists docker.io/library/debian:12-slim; then
    return
  fi
  if timeout 60 podman pull -q docker.io/library/debian:12 >/dev/null 2>&1 &&
     timeout 60 podman pull -q docker.io/library/debian:12-slim >/dev/null 2>&1; then
    say "base images pulled from docker.io"
    return
  fi
  say "no registry reachable: debian:12 and debian:12-slim from Debian's mirror (debootstrap)"
  local root=$tmp/rootfs
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian \
    >"$tmp/debootstrap.log" 2>&1 || { tail -20 "$tmp/debootstrap.log"; fail "debootstrap failed"; }
  slim_settings "$root"
  tar -C "$root" -c . | podman import -q --change 'CMD ["bash"]' - \
    docker.io/library/debian:12 >/dev/null
  slimify "$root"
  tar -C "$root" -c . | podman import -q --change 'CMD ["bash"]' - \
    docker.io/library/debian:12-slim >/dev/null
  rm -rf "$root"
}
base_images

# The one reason to skip: this machine cannot make the namespaces a
# container needs. Where it can, a container that does not start is a
# failure (of the runtime's settings above, say), not a skip.
if ! out=$(podman run --rm --network none docker.io/library/debian:12-slim true 2>&1); then
  if ! why=$(unshare --mount --uts --ipc --net --pid --fork true 2>&1); then
    say "SKIP: containers cannot run on this machine (no namespaces: $why); podman said: $out"
    exit 0
  fi
  fail "a plain container does not start, though this machine has namespaces: $out"
fi

# ---------------------------------------------------------------- the docs' commands
doc=$repo/docs/deploying.md
block() {  # the shell block after `<!-- container-check: $1 -->`
  awk -v name="$1" '
    $0 == "<!-- container-check: " name " -->" { found = 1; next }
    found && /^```sh$/ { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }' "$doc"
}
# Each block runs in a shell of its own with -e, which stops at the first
# failing command, after the variables the blocks before it set (as in the
# one shell a user types them into).
block_vars=""
run_block() {  # run_block NAME: the block as written, in the current directory
  local text
  text=$(block "$1")
  [ -n "$text" ] || fail "$doc has no block marked container-check: $1"
  say "running $doc's '$1' commands"
  bash -euo pipefail -c "$block_vars"$'\n'"$text" || return
  block_vars+=$(grep -E '^[A-Za-z_][A-Za-z0-9_]*=' <<<"$text")$'\n' || true
}
export -f docker

for i in dp-ps:0.1.0 dp-worker:0.1.0; do
  podman image exists "$i" || made_images+=("$i")
done
t0=$(date +%s)
run_block build >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; fail "building the images failed"; }
say "images built in $(($(date +%s) - t0)) s"
size_check() {  # size_check IMAGE MAX_MB
  local bytes mb
  bytes=$(podman image inspect --format '{{.Size}}' "$1")
  mb=$(( (bytes + 500000) / 1000000 ))
  say "image $1: $mb MB (target: at most $2 MB)"
  [ "$mb" -le "$2" ] || fail "image $1 is $mb MB, over its $2 MB target"
}
size_check dp-ps:0.1.0 120
size_check dp-worker:0.1.0 200

# The manifests the job's containers are compared with.
kubectl kustomize deploy/k8s/overlays/cpu >"$tmp/cpu.yaml"
settings() { python3 "$repo/deploy/tests/container_settings.py" "$@"; }

# What the manifests declare, looked up once, before the job starts.
ps_metrics=$(settings port "$tmp/cpu.yaml" dp-ps metrics)
worker_metrics=$(settings port "$tmp/cpu.yaml" dp-worker metrics)
settings probes "$tmp/cpu.yaml" dp-ps >"$tmp/probes.dp-ps"
settings probes "$tmp/cpu.yaml" dp-worker >"$tmp/probes.dp-worker"

ip_of() {
  podman inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"
}
poll() {  # poll SECONDS WHAT COMMAND...: until COMMAND succeeds
  local seconds=$1 what=$2
  local deadline=$(($(date +%s) + seconds))
  shift 2
  until "$@" >"$tmp/poll.out" 2>&1; do
    local failed
    failed=$(podman ps -a --filter status=exited --format '{{.Names}} {{.ExitCode}}' |
             awk '$2 != 0 { printf "%s exited %s; ", $1, $2 }')
    [ -z "$failed" ] || fail "$what: ${failed%; }"
    if [ "$(date +%s)" -ge "$deadline" ]; then
      fail "$what: still not after $seconds s: $(tail -3 "$tmp/poll.out")"
    fi
    sleep 0.2
  done
}
step_of_ps() {  # dp-ps's applied step, from its metrics
  curl -sf "http://$(ip_of dp-ps-0):$ps_metrics/metrics" |
    sed -n 's/^dp_training_step{[^}]*} \([0-9.e+]*\)$/\1/p' | head -1
}
step_at_least() {
  local s
  s=$(step_of_ps)
  [ -n "$s" ] && awk -v s="$s" -v n="$1" 'BEGIN { exit !(s >= n) }'
}
probes_answer() {  # probes_answer CONTAINER: every gRPC probe of its manifest
  local ip kind port service
  ip=$(ip_of "$1")
  [ -n "$ip" ] || { echo "$1 has no address: $(podman inspect -f '{{.State.Status}}' "$1")"; return 1; }
  while read -r kind port service; do
    [ "$service" = '""' ] && service=""
    "$probe" "$ip:$port" "$service" || { echo "($1's $kind)"; return 1; }
  done <"$tmp/probes.${1%-[0-9]*}"
}
metrics_answer() {  # metrics_answer CONTAINER PORT PATTERN
  local text
  text=$(curl -sf "http://$(ip_of "$1"):$2/metrics") && grep -q "$3" <<<"$text"
}
exit_code() { podman inspect -f '{{.State.ExitCode}}' "$1"; }

# One job from the docs' commands in a directory of its own (the model file
# lands there). "plain": probes and /metrics while it runs, then the
# containers' settings; "drain": dp-ps stopped (SIGTERM) at step 400 and
# started again.
job() {
  local dir=$tmp/job-$1 c
  mkdir -p "$dir"
  ln -s "$repo/deploy" "$dir/deploy"
  cd "$dir"
  run_block run >"$dir/run.log" 2>&1 || { cat "$dir/run.log"; fail "starting the job failed"; }
  if [ "$1" = plain ]; then
    # dp-ps serves from its start until the finish block stops it
    # (DP_EXIT_WHEN_DONE=false): its probes land whenever they come.
    poll 120 "dp-ps's gRPC probes answering SERVING" probes_answer dp-ps-0
    poll 60 "dp-ps's /metrics" metrics_answer dp-ps-0 "$ps_metrics" '^dp_build_info'
    # A worker answers SERVING once it has joined, and exits when the job
    # ends, however fast the machine. So the job is held from the moment
    # both have joined until every probe of theirs is in: dp-ps paused (its
    # cgroup frozen), no step can end, the workers wait for it (their calls'
    # deadlines are 30 s, and a wait that outlasts one is made again).
    for c in dp-worker-0 dp-worker-1; do
      poll 120 "$c's gRPC probes answering SERVING (it joined)" probes_answer "$c"
    done
    podman pause dp-ps-0 >/dev/null
    for c in dp-worker-0 dp-worker-1; do
      [ "$(podman inspect -f '{{.State.Status}}' "$c")" = running ] ||
        fail "$c is $(podman inspect -f '{{.State.Status}}, exit {{.State.ExitCode}}' "$c") once dp-ps was paused: the job ended before it could be held"
    done
    for c in dp-worker-0 dp-worker-1; do
      poll 60 "$c's gRPC probes answering SERVING, the job held" probes_answer "$c"
      poll 60 "$c's /metrics (tensors not in shared memory)" \
        metrics_answer "$c" "$worker_metrics" '^dp_worker_shared_memory{.*} 0$'
    done
    podman unpause dp-ps-0 >/dev/null
    say "$1: every gRPC probe of the manifests SERVING, every /metrics answering (the workers' with the job held)"
    for c in dp-ps-0 dp-worker-0 dp-worker-1; do
      podman inspect "$c" >"$dir/$c.json"
      settings compare "$tmp/cpu.yaml" "${c%-[0-9]*}" "$dir/$c.json" --index "${c##*-}" ||
        fail "$c does not run with the manifests' settings"
    done
    say "$1: every container runs with its pod's settings in overlays/cpu"
  else
    poll 300 "dp-ps at step 400" step_at_least 400
    podman stop dp-ps-0 >/dev/null
    local at
    at=$(podman logs dp-ps-0 2>&1 | sed -n 's/.*stopped by signal [0-9]* at step \([0-9]*\).*/\1/p' | tail -1)
    [ -n "$at" ] || fail "dp-ps was not stopped mid-job (exit $(exit_code dp-ps-0)): the job ended before SIGTERM came"
    [ "$(exit_code dp-ps-0)" = 3 ] ||
      fail "dp-ps exited $(exit_code dp-ps-0) after SIGTERM at step $at, want 3 (drained)"
    podman start dp-ps-0 >/dev/null
    say "$1: dp-ps stopped by SIGTERM at step $at (exit 3) and started again"
  fi
  run_block finish >"$dir/finish.log" 2>&1 || { cat "$dir/finish.log"; fail "finishing the job failed"; }
  for c in dp-worker-0 dp-worker-1; do
    local code
    code=$(exit_code "$c")
    [ "$code" = 0 ] || fail "$1: $c exited $code"
    # (grep -q in a pipe would end the pipe early: pipefail then fails it.)
    grep -q 'tensors through gRPC' <<<"$(podman logs "$c" 2>&1)" ||
      fail "$c does not say it sent its tensors through gRPC"
  done
  [ -s "$dir/simplenet.safetensors" ] || fail "$1: no model copied from the state volume"
  podman logs dp-ps-0 >"$dir/dp-ps.log" 2>&1
  local acc
  acc=$(sed -n 's/.*final test accuracy: \([0-9.]*\).*/\1/p' "$dir/dp-ps.log" | tail -1)
  [ -n "$acc" ] || fail "$1: dp-ps reported no final test accuracy"
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.8) }' || fail "$1: test accuracy $acc < 0.8"
  [ "$(exit_code dp-ps-0)" = 0 ] || fail "$1: dp-ps exited $(exit_code dp-ps-0) after the job, want 0"
  say "$1: workers exited 0, test accuracy $acc, model $(stat -c %s "$dir/simplenet.safetensors") bytes"
  run_block remove >/dev/null || fail "removing the job's containers, network and volume failed"
  cd "$repo"
}

t0=$(date +%s)
job plain
job drain
cmp "$tmp/job-plain/simplenet.safetensors" "$tmp/job-drain/simplenet.safetensors" ||
  fail "the model of the drained job differs from the uninterrupted job's"
say "drained job's model is byte-identical to the uninterrupted one's ($(($(date +%s) - t0)) s for both jobs)"
say "OK: every check passed"
