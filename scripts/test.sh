#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test.
# Then a second build with clang, AddressSanitizer + UndefinedBehaviorSanitizer
# and the libFuzzer target: it runs every test except the whole-job training
# tests (6 minutes under ASan instead of 1; they pass there too), and the
# fuzzer for DP_FUZZ_SECONDS (45) from its seed corpus. DP_SKIP_SANITIZE=1
# skips it. Between the two, scripts/container-check.sh builds the container
# images and runs a job in them (DP_SKIP_CONTAINERS=1 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
# This script's own settings, taken out of the environment: dp-ps and
# dp-worker warn about any DP_* variable that is not one of their flags,
# and refuse it with --dry_run (common/flags.cc), and the tests start them
# with this environment.
skip_sanitize=${DP_SKIP_SANITIZE:-0}
skip_containers=${DP_SKIP_CONTAINERS:-0}
fuzz_seconds=${DP_FUZZ_SECONDS:-45}
unset DP_SKIP_SANITIZE DP_SKIP_CONTAINERS DP_FUZZ_SECONDS
scripts/setup.sh
# Wherever nvcc is, the suite runs on a build with the CUDA module: dp-worker
# is the same binary either way, and the workers of the whole-job tests that
# ask for --backend=auto load the module (then fall back to the CPU where no
# GPU is usable), metrics on. The CUDA tests skip, saying why, without a GPU;
# cuda_module_check checks the module's architectures and that dp-worker
# links no CUDA library. The sanitizer build below is the CPU-only build.
scripts/build.sh
(cd build && ctest --output-on-failure --timeout 900 -j 2 "$@")
# The images built and run as a user would, with the manifests' settings
# (docs/deploying.md); a few minutes once Podman's cache holds the bases.
# DP_SKIP_CONTAINERS=1 skips it.
if [ "$skip_containers" != 1 ]; then
  scripts/container-check.sh build
fi

if [ "$skip_sanitize" = 1 ]; then
  exit 0
fi
# -O1 with line tables: builds in half the time of -O2 -g, runs about as fast
# under ASan, and reports still have file:line.
BUILD_DIR=build-sanitize BUILD_TYPE=None scripts/build.sh \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS="-O1 -gline-tables-only" \
  -DDP_ENABLE_CUDA=OFF -DDP_SANITIZE=ON -DDP_FUZZ=ON \
  -DDP_FUZZ_SECONDS="$fuzz_seconds"
cd build-sanitize
# deploy/ checks run the release binaries in a chroot (no /proc there, which
# the sanitizers need); they say nothing about memory safety. Neither do the
# simulated network's (netsim), which ran above. The Python worker's
# (python) are whole-job training tests, as the ones -E names.
ctest --output-on-failure --timeout 900 -j 2 -LE 'deploy|netsim|python' \
  -E '^(grpc:)?(JobTest|FaultTest|ElasticJobTest|EquivalenceTest|ReplanTest|DataPlaneTest|ShardTest)\.' "$@"
