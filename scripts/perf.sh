#!/usr/bin/env bash
# The performance comparison of dp-ps against PyTorch on this machine, each
# number a median of repeated runs measured in this run:
#  1. one table, Fashion-MNIST, 2 workers x 64: dp-ps over gRPC (and over
#     shared memory when dp-worker has --data_plane), float32 / bf16
#     gradients / bf16 gradients and weights, vs PyTorch DDP (gloo, 2 x 64)
#     and PyTorch single process (128): samples/s, test accuracy, ratios,
#     compute and exchange per step, CPU time per step and peak RSS of dp-ps
#     and of a worker, share of the compute limit (backend_bench, this run);
#  2. the same runs per step: server update, wait, bytes, overhead;
#  3. the step split at batch 512 per worker;
#  4. server update time for N = 1, 2, 4, 8, and the loopback call costs;
#  5. the exchange alone (workers with the null backend, as on GPUs), N = 1,
#     2, 4, 8, both data planes, against dp-ps's update alone
#     (scripts/perf-null.sh, which also runs on its own);
#  6. a wider model (--layers=3072,1024,512,10, CIFAR-shaped .npy data):
#     dp-ps vs PyTorch DDP and a single process, samples/s.
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
# shellcheck source=scripts/perf-lib.sh
. scripts/perf-lib.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/dp-perf-XXXXXX")
trap 'rm -rf "$work"' EXIT

# The data planes to compare: gRPC, and shared memory when dp-worker has
# --data_plane (without it, the gRPC row passes no flag).
planes=grpc
help=$(build/worker/dp-worker --help 2>&1 || true)
if grep -q -- '--data_plane ' <<<"$help"; then planes="grpc shm"; fi
plane_flags() {  # the launch.sh flags that pick data plane $1
  [ "$planes" = grpc ] || echo "--worker_flag=--data_plane=$1"
}
encodings="f32 bf16g bf16gw"
encoding_flags() {
  case "$1" in
    f32) ;;
    bf16g) echo "--grad_encoding=bf16" ;;
    bf16gw) echo "--grad_encoding=bf16 --weight_encoding=bf16" ;;
  esac
}
dp_rows=()
for plane in $planes; do
  for enc in $encodings; do dp_rows+=("${plane}_$enc"); done
done
rows=("${dp_rows[@]}" torch_ddp torch_single)
declare -A label=([torch_ddp]="torch DDP 2x64" [torch_single]="torch 1x128")
for row in "${dp_rows[@]}"; do label[$row]="dp-ps ${row/_/ }"; done

rusage_cpu_ms() {  # CPU ms per step of a --rusage file over $2 steps
  local line user sys
  line=$(tail -n 1 "$1" 2>/dev/null) || { echo -; return; }
  read -r _ user sys _ <<<"$line"
  calc "%.2f" "(a + b) * 1000 / c" "$user" "$sys" "${2:--}"
}
rusage_rss_mb() {  # peak RSS in MB of a --rusage file
  local line
  line=$(tail -n 1 "$1" 2>/dev/null) || { echo -; return; }
  calc "%.0f" "a / 1024" "$(awk '{print $4}' <<<"$line")"
}

# dp-ps job under launch.sh --rusage; appends to $work/$row one line:
# samples/s accuracy compute_ms exchange_ms ps_cpu_ms worker_cpu_ms ps_rss_mb
# worker_rss_mb update_ms wait_ms sent_MB received_MB (worker = rank 0).
dash_line="- - - - - - - - - - - -"
dp_job() {
  local row=$1 dir ps w ps_steps w_steps v values=()
  shift
  if ! dir=$(launch_run "$row" --rusage --workers 2 --dataset=fashion-mnist "$@"); then
    echo "$dash_line" >>"$work/$row"
    return
  fi
  ps=$(cat "$dir/dp-ps.log")
  w=$(grep "finished at step" "$dir/worker-0.log" || true)
  ps_steps=$(field 's/.*done: \([0-9]*\) steps in.*/\1/p' "$ps")
  w_steps=$(field 's/.*: \([0-9]*\) steps here.*/\1/p' "$w")
  for v in \
    "$(field 's/.* \([0-9]*\) samples\/s while training.*/\1/p' "$ps")" \
    "$(field 's/.*final test accuracy: \([0-9.]*\).*/\1/p' "$ps")" \
    "$(field 's/.*, \([0-9.]*\) ms compute.*/\1/p' "$w")" \
    "$(field 's/.* + \([0-9.]*\) ms exchange.*/\1/p' "$w")" \
    "$(rusage_cpu_ms "$dir/dp-ps.rusage" "$ps_steps")" \
    "$(rusage_cpu_ms "$dir/worker-0.rusage" "$w_steps")" \
    "$(rusage_rss_mb "$dir/dp-ps.rusage")" \
    "$(rusage_rss_mb "$dir/worker-0.rusage")" \
    "$(field 's/.*per step: update \([0-9.]*\) ms.*/\1/p' "$ps")" \
    "$(field 's/.*rank 0 \([0-9.]*\) ms.*/\1/p' "$ps")" \
    "$(field 's/.*, \([0-9.]*\) MB sent.*/\1/p' "$w")" \
    "$(field 's/.* + \([0-9.]*\) MB received.*/\1/p' "$w")"; do
    values+=("${v:--}")
  done
  echo "${values[*]}" >>"$work/$row"
  rm -rf "$dir"
}
# PyTorch job; appends the same fields (rank 0 as the worker, no server).
torch_job() {
  local row=$1 out line
  shift
  out=$(/usr/bin/python3 bench/torch_ddp.py "$@" 2>&1) || true
  line=$(sed -n 's/^RESULT .*samples_per_s=\([0-9]*\) accuracy=\([0-9.]*\) steps=\([0-9]*\) cpu_s=\([0-9.]*\) max_rss_kb=\([0-9]*\).*/\1 \2 \3 \4 \5/p' <<<"$out")
  if [ -z "$line" ]; then
    echo "perf: $row failed:" >&2
    tail -n 5 <<<"$out" >&2
    echo "$dash_line" >>"$work/$row"
    return
  fi
  awk '{printf "%s %s - - - %.2f - %.0f - - - -\n", $1, $2, $4 * 1000 / $3, $5 / 1024}' \
    <<<"$line" >>"$work/$row"
}

for row in "${rows[@]}"; do : >"$work/$row"; done
for ((i = 1; i <= repeats; i++)); do
  build/bench/backend_bench --batches=64 | awk '$1 == 64 {print $2}' >>"$work/fwd_bwd_ms"
  for row in "${dp_rows[@]}"; do
    # shellcheck disable=SC2046  # the flags are words
    dp_job "$row" --epochs="$epochs" --batch_size=64 $(plane_flags "${row%_*}") \
      $(encoding_flags "${row#*_}")
  done
  torch_job torch_ddp --mode ddp --epochs "$epochs"
  torch_job torch_single --mode single --epochs "$epochs"
done

declare -A med  # med[row,column], columns numbered from 1 as in dp_job
for row in "${rows[@]}"; do
  for c in $(seq 12); do
    med[$row,$c]=$(awk -v c="$c" '{print $c}' "$work/$row" | median)
  done
done
fwd_bwd_ms=$(median <"$work/fwd_bwd_ms")
limit=$(calc "%.0f" "2 * 64 * 1000 / a" "$fwd_bwd_ms")

echo "== 1. Fashion-MNIST, 2 workers x 64, epochs: $epochs, median of $repeats runs (same machine, same run)"
table_row() { printf "%-17s %9s %6s %6s %6s %6s %6s %6s %6s %6s %6s %6s\n" "$@"; }
printf "%-17s %9s %6s %6s %6s %13s %13s %13s %6s\n" "" "" "" "" "" \
  "step ms" "CPU ms/step" "peak RSS MB" "of"
table_row system samples/s acc vsDDP vs1p comp exch dp-ps worker dp-ps worker limit
for row in "${rows[@]}"; do
  rate=${med[$row,1]}
  table_row "${label[$row]}" "$rate" "${med[$row,2]}" \
    "$(calc "%.2fx" "a / b" "$rate" "${med[torch_ddp,1]}")" \
    "$(calc "%.2fx" "a / b" "$rate" "${med[torch_single,1]}")" \
    "${med[$row,3]}" "${med[$row,4]}" "${med[$row,5]}" "${med[$row,6]}" \
    "${med[$row,7]}" "${med[$row,8]}" \
    "$(calc "%.0f%%" "100 * a / b" "$rate" "$limit")"
done
echo "rows: dp-ps with its workers' data plane (grpc, shm) and encoding (f32; bf16g: bf16"
echo "  gradients; bf16gw: bf16 gradients and weights); PyTorch DDP (gloo) and one process."
echo "vsDDP, vs1p: samples/s over PyTorch DDP's and the single process's. step ms: rank 0's"
echo "  compute (forward+backward) and exchange per step. CPU ms/step: user+system time over"
echo "  the process's whole life (data load and final test included) / its steps; worker:"
echo "  rank 0. peak RSS: the kernel's max RSS (GNU time; getrusage in PyTorch's rank 0)."
echo "of limit: samples/s / compute limit, 2 cores x 64 / forward+backward at 64 ="
echo "  2 x 64 / $fwd_bwd_ms ms = $limit samples/s (backend_bench, 1 thread, this run)."

echo
echo "== 2. the same runs, per step (medians): dp-ps update, rank 0's push to published"
echo "   update (update included), rank 0's MB sent/received, (compute+exchange)/compute"
detail_row() { printf "%-17s %10s %10s %10s %10s %10s\n" "$@"; }
detail_row system update_ms wait_ms sent_MB recv_MB overhead
for row in "${dp_rows[@]}"; do
  detail_row "${label[$row]}" "${med[$row,9]}" "${med[$row,10]}" "${med[$row,11]}" \
    "${med[$row,12]}" "$(calc "%.2f" "(a + b) / a" "${med[$row,3]}" "${med[$row,4]}")"
done

echo
echo "== 3. batch 512 per worker, 150 steps, one run each"
detail_row system compute_ms exchange_ms update_ms wait_ms overhead
for row in "${dp_rows[@]}"; do
  : >"$work/b512"
  # shellcheck disable=SC2046
  dp_job b512 --max_steps=150 --batch_size=512 $(plane_flags "${row%_*}") \
    $(encoding_flags "${row#*_}")
  read -r _ _ compute exchange _ _ _ _ update wait _ _ <"$work/b512"
  detail_row "${label[$row]}" "$compute" "$exchange" \
    "$update" "$wait" "$(calc "%.2f" "(a + b) / a" "$compute" "$exchange")"
done

echo
echo "== 4. server update and loopback calls"
build/bench/exchange_bench

echo
echo "== 5. the exchange alone"
scripts/perf-null.sh "$repeats"
# 6. A model of the user's: 3072-1024-512-10 (4.7 M parameters, 19 MB of
# float32 a tensor exchange) on CIFAR-shaped random .npy data.
wide=$work/wide wide_layers=3072,1024,512,10 wide_steps=60
/usr/bin/python3 - "$wide" <<'PY'
import os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
np.save(os.path.join(d, "train_x.npy"),
        rng.standard_normal((4096, 3072), dtype=np.float32))
np.save(os.path.join(d, "train_y.npy"), rng.integers(0, 10, 4096))
PY
for row in wide_dp wide_ddp wide_single; do : >"$work/$row"; done
for ((i = 1; i <= repeats; i++)); do
  if dir=$(launch_run wide --workers 2 --dataset=npy --layers=$wide_layers \
    --data_dir "$wide" --batch_size=64 --max_steps=$wide_steps); then
    field 's/.* \([0-9]*\) samples\/s while training.*/\1/p' \
      "$(cat "$dir/dp-ps.log")" >>"$work/wide_dp"
    rm -rf "$dir"
  fi
  for mode in ddp single; do
    /usr/bin/python3 bench/torch_ddp.py --mode $mode --layers $wide_layers \
      --data "$wide" --max_steps $wide_steps --epochs 100 2>&1 |
      sed -n 's/^RESULT .*samples_per_s=\([0-9]*\).*/\1/p' >>"$work/wide_$mode"
  done
done
wide_dp=$(median <"$work/wide_dp")
wide_ddp=$(median <"$work/wide_ddp")
wide_single=$(median <"$work/wide_single")
echo
echo "== 6. your own model: --layers=$wide_layers on CIFAR-shaped .npy data (4096 x 3072),"
echo "   2 workers x 64 (default data plane), $wide_steps steps, median of $repeats runs"
printf "%-17s %9s %6s %6s\n" system samples/s vsDDP vs1p
printf "%-17s %9s %6s %6s\n" "dp-ps 2x64" "$wide_dp" \
  "$(calc "%.2fx" "a / b" "$wide_dp" "$wide_ddp")" \
  "$(calc "%.2fx" "a / b" "$wide_dp" "$wide_single")"
printf "%-17s %9s\n" "torch DDP 2x64" "$wide_ddp" "torch 1x128" "$wide_single"

if command -v nvidia-smi >/dev/null 2>&1; then
  echo; echo "GPU present: see scripts/gpu-check.sh for the CUDA table"
fi
