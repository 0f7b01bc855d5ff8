#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 -j 2 "$@"
