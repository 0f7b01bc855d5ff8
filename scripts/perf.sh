#!/usr/bin/env bash
# The performance comparison of dp-ps against PyTorch on this machine, each
# number a median of repeated runs measured in this run:
#  1. samples/s and test accuracy: dp-ps + 2 workers x 64 (float32; bf16
#     gradients; bf16 gradients and weights) vs PyTorch DDP (gloo, 2 x 64)
#     vs PyTorch single process (128);
#  2. per step at batch 64 and 512 per worker: compute, exchange, server
#     update, wait; protocol overhead = step time / compute time;
#  3. bytes on the wire per step per worker;
#  4. server update time for N = 1, 2, 4, 8, and the loopback call costs.
# Installs Debian's python3-torch when missing. Not a test: prints numbers.
# Usage: scripts/perf.sh [epochs, default 3] [repeats, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-3}
repeats=${2:-3}
scripts/setup.sh >/dev/null
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "perf: installing python3-torch (PyTorch baseline)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null
fi
scripts/build.sh >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

median() { sort -n | sed -n "$(( (repeats + 1) / 2 ))p"; }
last_run() { ls -td "${TMPDIR:-/tmp}"/dp-run-* | head -1; }

# dp-ps job; prints "samples_per_s accuracy" and leaves logs in last_run.
dp_job() {
  local out
  out=$(BIN=build scripts/launch.sh --workers 2 --dataset=fashion-mnist "$@" 2>&1)
  echo "$(sed -n 's/.* \([0-9]*\) samples\/s while training.*/\1/p' <<<"$out")" \
       "$(sed -n 's/.*final test accuracy: \([0-9.]*\).*/\1/p' <<<"$out")"
}
torch_job() {
  /usr/bin/python3 bench/torch_ddp.py "$@" | sed -n 's/RESULT .*samples_per_s=\([0-9]*\) accuracy=\([0-9.]*\)/\1 \2/p'
}

declare -A rate acc
systems="dp_f32 dp_bf16_grad dp_bf16_both torch_ddp torch_single"
for name in $systems; do : >"/tmp/perf-$name"; done
for ((i = 1; i <= repeats; i++)); do
  dp_job --epochs="$epochs" --batch_size=64 >>/tmp/perf-dp_f32
  dp_job --epochs="$epochs" --batch_size=64 --grad_encoding=bf16 >>/tmp/perf-dp_bf16_grad
  dp_job --epochs="$epochs" --batch_size=64 --grad_encoding=bf16 \
    --weight_encoding=bf16 >>/tmp/perf-dp_bf16_both
  torch_job --mode ddp --epochs "$epochs" >>/tmp/perf-torch_ddp
  torch_job --mode single --epochs "$epochs" >>/tmp/perf-torch_single
done
for name in $systems; do
  rate[$name]=$(cut -d' ' -f1 "/tmp/perf-$name" | median)
  acc[$name]=$(cut -d' ' -f2 "/tmp/perf-$name" | median)
done
echo "== 1. Fashion-MNIST, 2 workers x 64, $epochs epochs, median of $repeats (same machine, same run)"
printf "%-34s %12s %10s %12s\n" "system" "samples/s" "accuracy" "vs DDP"
for name in $systems; do
  printf "%-34s %12s %10s %12s\n" "$name" "${rate[$name]}" "${acc[$name]}" \
    "$(awk -v a="${rate[$name]}" -v b="${rate[torch_ddp]}" 'BEGIN{printf "%.2fx", a/b}')"
done

echo
echo "== 2./3. per step and per worker (rank 0), 300 steps; enc = gradients/weights"
printf "%-6s %-9s %10s %10s %10s %10s %10s %10s %10s\n" batch enc compute_ms exchange_ms update_ms wait_ms overhead sent_MB recv_MB
for batch in 64 512; do
  for enc in f32/f32 bf16/f32 bf16/bf16; do
    dp_job --max_steps=300 --batch_size="$batch" --grad_encoding="${enc%/*}" \
      --weight_encoding="${enc#*/}" >/dev/null
    w=$(grep "finished at step" "$(last_run)/worker-0.log")
    ps=$(grep "per step: update" "$(last_run)/dp-ps.log")
    compute=$(sed -n 's/.*, \([0-9.]*\) ms compute.*/\1/p' <<<"$w")
    exchange=$(sed -n 's/.* + \([0-9.]*\) ms exchange.*/\1/p' <<<"$w")
    sent=$(sed -n 's/.*, \([0-9.]*\) MB sent.*/\1/p' <<<"$w")
    recv=$(sed -n 's/.* + \([0-9.]*\) MB received.*/\1/p' <<<"$w")
    update=$(sed -n 's/.*update \([0-9.]*\) ms.*/\1/p' <<<"$ps")
    wait=$(sed -n 's/.*rank 0 \([0-9.]*\) ms.*/\1/p' <<<"$ps")
    overhead=$(awk -v c="$compute" -v e="$exchange" 'BEGIN{printf "%.2f", (c+e)/c}')
    printf "%-6s %-9s %10s %10s %10s %10s %10s %10s %10s\n" "$batch" "$enc" "$compute" "$exchange" "$update" "$wait" "$overhead" "$sent" "$recv"
  done
done
echo "(wait: from rank 0's push to the published update, update included;"
echo " the rest of exchange is transfer and (de)serialisation)"

echo
echo "== 4. server update and loopback calls"
build/bench/exchange_bench
if command -v nvidia-smi >/dev/null 2>&1; then
  echo; echo "GPU present: see scripts/gpu-check.sh for the CUDA table"
fi
