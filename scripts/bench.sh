#!/usr/bin/env bash
# Prints the numbers of the foundation benchmark, each a median of repeats:
#  - CPU backend forward+backward at batch 64 and 512 (one thread);
#  - costs of the dp.v1 calls over loopback and of the server update;
#  - samples/s of the local job (dp-ps + 2 workers x 64, Fashion-MNIST).
# Usage: scripts/bench.sh [runs of the job, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
scripts/setup.sh >/dev/null
scripts/build.sh >/dev/null
export OPENBLAS_NUM_THREADS=1

echo "== CPU backend, SimpleNet forward+backward, 1 thread"
build/bench/backend_bench --batches=64,512
echo
echo "== dp.v1 over loopback gRPC"
build/bench/exchange_bench
echo
echo "== local job: dp-ps + 2 dp-workers x 64, Fashion-MNIST, 1 epoch (median of $runs)"
rates=()
for ((i = 1; i <= runs; i++)); do
  line=$(BIN=build scripts/launch.sh --workers 2 --epochs=1 --batch_size=64 \
           --dataset=fashion-mnist 2>&1 | grep "samples/s while training")
  rate=$(sed -n 's/.* \([0-9]*\) samples\/s while training.*/\1/p' <<<"$line")
  echo "run $i: $rate samples/s"
  rates+=("$rate")
done
median=$(printf '%s\n' "${rates[@]}" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
echo "median: $median samples/s (PyTorch DDP gloo 2 x 64 on this machine: ~28,500)"
