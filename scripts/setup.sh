#!/usr/bin/env bash
# Installs the Debian 12 packages dp-ps needs to build, train and test,
# and the npm packages of the deploy tests (deploy/tests, from its lock file).
# Idempotent: installs only what is missing. Needs root (or sudo).
# kubectl (for `kubectl kustomize`, >= 1.21) is not a Debian 12 package
# (kubernetes-client is 1.20): it must already be on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  # build
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  libopenblas-dev zlib1g-dev libssl-dev
  # data
  dataset-fashion-mnist
  # sanitizer and fuzzing build (scripts/test.sh)
  clang libclang-rt-14-dev
  # tests (prometheus: promtool and the server the monitoring test scrapes with)
  prometheus openssl yamllint python3 python3-yaml
  # the simulated cluster network (scripts/netsim.sh: ip, ip netns, tc)
  iproute2
  # benchmarks (scripts/perf.sh: launch.sh --rusage)
  time
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js >= 18 and npm for the deploy tests: Debian's nodejs + npm, unless
# a Node.js is already installed (another build of nodejs bundles npm and
# conflicts with Debian's npm package).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

npm_packages() {
  local dir=deploy/tests
  # npm ci again only when the lock file changed since the last install.
  if [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ] ||
     [ ! -f "$dir/node_modules/.package-lock.json" ]; then
    echo "setup: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  npm_packages
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
