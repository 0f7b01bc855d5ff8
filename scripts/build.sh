#!/usr/bin/env bash
# Configures and builds dp-ps into build/ (CUDA backend too when nvcc exists).
# Usage: scripts/build.sh [extra cmake -D options]
# BUILD_DIR (default build), BUILD_TYPE (Release), TARGETS (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" ${TARGETS:+--target $TARGETS}
