#!/usr/bin/env bash
# The main job: install what is missing, build, and train SimpleNet on
# Fashion-MNIST with dp-ps and 2 dp-workers on this machine.
# Extra arguments go to scripts/launch.sh (e.g. --epochs=5 --workers 4).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec scripts/launch.sh --workers 2 --epochs=3 --batch_size=64 \
  --dataset=fashion-mnist --save_model=build/simplenet.safetensors "$@"
