#!/usr/bin/env bash
# The main job: install what is missing, build, and train SimpleNet on
# Fashion-MNIST with dp-ps and 2 dp-workers on this machine.
# Installs and builds only what training needs (scripts/setup.sh --train;
# the CMake target `binaries`: dp-ps, dp-worker and, where nvcc is, the
# CUDA module), not the test toolchain nor the tests: scripts/test.sh does.
# Extra arguments go to scripts/launch.sh (e.g. --epochs=5 --workers 4).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --train
TARGETS=binaries scripts/build.sh
exec scripts/launch.sh --workers 2 --epochs=3 --batch_size=64 \
  --dataset=fashion-mnist --save_model=build/simplenet.safetensors "$@"
