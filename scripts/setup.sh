#!/usr/bin/env bash
# Installs the Debian 12 packages dp-ps needs, and the npm packages of the
# deploy tests (deploy/tests, from its lock file).
# Usage: scripts/setup.sh [--train]
#   (default)  everything: build, train, test, benchmarks (scripts/test.sh)
#   --train    only what building and running dp-ps and dp-worker needs
#              (scripts/train.sh): the compiler, the libraries, the data set
# Idempotent: installs only what is missing. Needs root (or sudo).
# kubectl (for `kubectl kustomize`, >= 1.21: the deploy tests and
# scripts/container-check.sh) is not a Debian 12 package (kubernetes-client
# is 1.20): it must already be on the machine, from the Kubernetes apt
# repository (pkgs.k8s.io, package kubectl), Google Cloud's
# (packages.cloud.google.com, package kubectl) or a release binary
# (dl.k8s.io). Without --train, a missing kubectl is named at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

train_only=false
case "${1:-}" in
  "") ;;
  --train) train_only=true ;;
  *) echo "setup: unknown argument '$1' (usage: scripts/setup.sh [--train])" >&2; exit 2 ;;
esac

# GoogleTest is among the build packages: CMake configures the tests'
# targets even when it builds only dp-ps and dp-worker. (The lines from
# "# build" to "# data" are what deploy/tests/check-dockerfiles.js wants
# in the images' build stages.)
TRAIN_PACKAGES=(
  # build
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  libopenblas-dev zlib1g-dev libssl-dev
  # data
  dataset-fashion-mnist
)
TEST_PACKAGES=(
  # sanitizer and fuzzing build (scripts/test.sh)
  clang libclang-rt-14-dev
  # tests (prometheus: promtool and the server the monitoring test scrapes
  # with; openssl: tests/make_test_certs.sh)
  prometheus openssl yamllint python3 python3-yaml
  # the Python worker (python/dp_ps) and its tests
  python3-grpcio python3-protobuf python3-torch python3-prometheus-client
  # the simulated cluster network (scripts/netsim.sh: ip, ip netns, tc)
  iproute2
  # benchmarks (scripts/perf.sh: launch.sh --rusage runs GNU time and
  # signals its child with pkill; scripts/rss-soak.sh: bc;
  # scripts/pack-gpu.sh: xz)
  time procps bc xz-utils
)
PACKAGES=("${TRAIN_PACKAGES[@]}")
$train_only || PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js >= 18 and npm for the deploy tests: Debian's nodejs + npm, unless
# a Node.js is already installed (another build of nodejs bundles npm and
# conflicts with Debian's npm package).
if ! $train_only &&
   { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; }; then
  missing+=(nodejs npm)
fi

npm_packages() {
  if $train_only; then return 0; fi
  local dir=deploy/tests
  # npm ci again only when the lock file changed since the last install.
  if [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ] ||
     [ ! -f "$dir/node_modules/.package-lock.json" ]; then
    echo "setup: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
}

kubectl_note() {
  if ! $train_only && ! command -v kubectl >/dev/null 2>&1; then
    echo "setup: kubectl (>= 1.21) missing, not a Debian 12 package: the deploy" \
      "tests and scripts/container-check.sh need it (this script's header says where from)" >&2
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  npm_packages
  kubectl_note
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "setup: not root and no sudo. As root, run:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
npm_packages
kubectl_note
