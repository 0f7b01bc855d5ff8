#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, CUDA 13 and
# python3+torch but none of our Debian libraries. Unpacks gpu-pack/dp-gpu.tar.xz
# (made by scripts/pack-gpu.sh on the build machine) and runs:
#   1. nvidia-smi
#   2. cuda_backend_test and cpu_backend_test (on a GPU, no test may skip),
#      and cuda_module_check (dp-worker links no CUDA library, the module
#      holds code for sm_75..sm_120 + PTX, --backend=auto chooses cuda)
#   3. compute-sanitizer memcheck and racecheck over the kernel tests
#   4. end to end: dp-ps + 2 dp-worker --backend cuda with metrics on for
#      every process (each /metrics scraped while it trains), Fashion-MNIST,
#      1 epoch, batch 64: final test accuracy >= 0.84, samples/s reported
#   5. forward+backward time at batch 64, 512, 4096 against PyTorch eager on
#      the same GPU (bench/torch_gpu_bench.py), as ratios
# Logs and summary.txt go to $OUT if set, else build-gpu-check/. Exit 0 only
# when every check passed.
#
# --dry-run (automatic where nvidia-smi sees no GPU) checks the pack instead:
# every packed binary finds each library in the pack or among the system's
# glibc and CUDA libraries, the binaries run (CPU tests, the CUDA tests skip),
# a short CPU job runs from the packed data, and the torch bench compiles.
#
# Usage: scripts/gpu-check.sh [--dry-run] [--pack FILE]
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PACK=gpu-pack/dp-gpu.tar.xz
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --pack) PACK=$2; shift ;;
    --pack=*) PACK=${1#*=} ;;
    *) echo "usage: $0 [--dry-run] [--pack FILE]" >&2; exit 2 ;;
  esac
  shift
done

LOG=${OUT:-$ROOT/build-gpu-check}
mkdir -p "$LOG"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dp-gpu-check-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SUMMARY=$LOG/summary.txt
: >"$SUMMARY"
failed=0
SECONDS=0

say() { echo "gpu-check: $*" | tee -a "$SUMMARY"; }
# result NAME PASS|FAIL|UNAVAILABLE DETAIL
result() {
  printf '%-14s %-11s %s\n' "$1" "$2" "$3" | tee -a "$SUMMARY"
  [ "$2" = PASS ] || failed=1
}
finish() {
  say "done in ${SECONDS}s; logs in $LOG"
  [ "$failed" -eq 0 ] && say "ALL PASSED" || say "SOME CHECKS DID NOT PASS"
  exit "$failed"
}

# ---------------------------------------------------------------------------
# Unpack and find the libraries.
if [ ! -f "$PACK" ]; then
  say "no pack at $PACK: run scripts/pack-gpu.sh on the build machine"
  exit 1
fi
tar -C "$WORK" -xJf "$PACK" || { say "cannot unpack $PACK"; exit 1; }
P=$WORK/dp-gpu
say "pack: $(head -2 "$P/MANIFEST" | tr '\n' ' ')"

has_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  has_gpu=1
fi
if [ "$has_gpu" -eq 0 ] && [ "$dry_run" -eq 0 ]; then
  say "no GPU visible to nvidia-smi: dry run"
  dry_run=1
fi

# CUDA 13 runtime and cuBLAS: the toolkit's, else those of pip's nvidia-*.
cuda_dirs=""
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 \
  /usr/local/cuda/targets/x86_64-linux/lib; do
  if [ -e "$d/libcublas.so.13" ] && [ -e "$d/libcudart.so.13" ]; then
    cuda_dirs=$d
    break
  fi
done
if [ -z "$cuda_dirs" ] && command -v python3 >/dev/null 2>&1; then
  for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' \
    2>/dev/null); do
    for f in $(find "$sp/nvidia" \( -name 'libcublas.so.13' -o \
      -name 'libcublasLt.so.13' -o -name 'libcudart.so.13' \) 2>/dev/null); do
      cuda_dirs=${cuda_dirs:+$cuda_dirs:}$(dirname "$f")
    done
  done
fi
LDP=$P/lib${cuda_dirs:+:$cuda_dirs}

# Names a packed binary may take from the system rather than the pack.
from_system() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libpthread.so* | \
      libdl.so* | librt.so* | libutil.so* | libresolv.so* | libstdc++.so* | \
      libgcc_s.so*) return 0 ;;
  esac
  return 1
}
is_cuda_lib() {
  case "$1" in
    libcuda.so* | libcudart.so* | libcublas*.so* | libnvidia*.so* | \
      libnvrtc*.so* | libnvJitLink*.so*) return 0 ;;
  esac
  return 1
}

# Uses lib-compat (our libstdc++/libgcc_s) only where the system's are older.
if LD_LIBRARY_PATH=$LDP ldd "$P"/bin/*/* 2>&1 |
  grep -Eq "(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found|libstdc\+\+.so.6 => not found"; then
  LDP=$P/lib:$P/lib-compat${cuda_dirs:+:$cuda_dirs}
  say "the system's libstdc++ is older than the pack's: using lib-compat/"
fi
say "LD_LIBRARY_PATH=$LDP"
# The tests load the packed CUDA module (dp-worker finds it next to itself).
export DP_CUDA_MODULE=$P/bin/worker/libdp_cuda.so
run() { LD_LIBRARY_PATH=$LDP "$@"; }

# ---------------------------------------------------------------------------
# Pack completeness: every library resolves inside the pack or is the
# system's glibc/libstdc++ or CUDA; no symbol version is missing.
check_pack() {
  local bad=0 cuda_missing="" b line name path
  for b in "$P"/bin/*/*; do
    [[ "$b" == *.py ]] && continue
    while read -r line; do
      case "$line" in
        *"version "*" not found"*)
          echo "  $(basename "$b"): $line"
          bad=1
          continue ;;
      esac
      [[ "$line" == *" => "* ]] || continue
      name=${line%% =>*}
      name=${name//[[:space:]]/}
      path=$(echo "$line" | awk '{print $3}')
      if [ "$path" = "not" ]; then
        if is_cuda_lib "$name"; then
          cuda_missing="$cuda_missing $name"
        else
          echo "  $(basename "$b"): $name not found"
          bad=1
        fi
      elif [[ "$path" != "$P/"* ]] && ! from_system "$name" &&
        ! is_cuda_lib "$name"; then
        echo "  $(basename "$b"): $name resolved outside the pack: $path"
        bad=1
      fi
    done < <(run ldd "$b" 2>&1)
  done
  if [ -n "$cuda_missing" ]; then
    echo "  CUDA libraries not found here:$(echo "$cuda_missing" | tr ' ' '\n' |
      sort -u | tr '\n' ' ')"
    [ "$dry_run" -eq 1 ] || bad=1
  fi
  return $bad
}
if out=$(check_pack); then
  result pack PASS "every library resolves (pack: $(du -sh "$PACK" | cut -f1))"
  [ -n "$out" ] && echo "$out" | tee -a "$SUMMARY"
else
  result pack FAIL "incomplete:"
  echo "$out" | tee -a "$SUMMARY"
  finish
fi
if ! run "$P/bin/server/dp-ps" --version >/dev/null 2>"$WORK/err" ||
  ! run "$P/bin/worker/dp-worker" --version >/dev/null 2>>"$WORK/err"; then
  result start FAIL "the packed binaries do not start: $(head -3 "$WORK/err")"
  finish
fi

# ---------------------------------------------------------------------------
# Tests.
TESTS_LOG=$LOG/tests.log
: >"$TESTS_LOG"
run_tests() {  # run_tests NAME: PASS when exit 0 and (on a GPU) nothing skipped
  local name=$1 t0=$SECONDS
  echo "=== $name" >>"$TESTS_LOG"
  run timeout 600 "$P/bin/tests/$name" >>"$WORK/$name.log" 2>&1
  local code=$?
  cat "$WORK/$name.log" >>"$TESTS_LOG"
  local summary
  summary=$(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' \
    "$WORK/$name.log" | sed 's/^\[ *\([A-Z]*\) *\] \([0-9]*\) tests\{0,1\}.*/\2 \1,/' |
    tr '\n' ' ')
  if [ "$code" -ne 0 ]; then
    result "$name" FAIL "exit $code: $summary($((SECONDS - t0))s)"
    grep -E '^\[  FAILED  \]' "$WORK/$name.log" | head -20 | tee -a "$SUMMARY"
  elif [ "$dry_run" -eq 0 ] && grep -q '^\[  SKIPPED \]' "$WORK/$name.log"; then
    result "$name" FAIL "tests skipped on a GPU machine: $summary"
    grep -A1 'Skipped$' "$WORK/$name.log" | head -4 | tee -a "$SUMMARY"
  else
    result "$name" PASS "$summary($((SECONDS - t0))s)"
  fi
}

if [ "$dry_run" -eq 0 ]; then
  say "$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
    --format=csv,noheader 2>&1 | head -1)"
  nvidia-smi >"$LOG/nvidia-smi.txt" 2>&1
fi
run_tests cuda_backend_test
run_tests cpu_backend_test
t0=$SECONDS
if run python3 "$P/bin/tests/cuda_module_check.py" \
  --worker "$P/bin/worker/dp-worker" --module "$DP_CUDA_MODULE" \
  >"$WORK/module.log" 2>&1; then
  result module PASS "$(tail -1 "$WORK/module.log") ($((SECONDS - t0))s)"
else
  result module FAIL "$(grep FAIL "$WORK/module.log" | head -3 | tr '\n' ' ')"
fi
cat "$WORK/module.log" >>"$TESTS_LOG"

# ---------------------------------------------------------------------------
# compute-sanitizer over the kernel tests and the determinism tests (which
# run the whole backend, graphs included).
SAN_FILTER='CudaKernelTest.*:CudaBackendTest.SameBatchTwice*:CudaBackendTest.Graphs*'
if [ "$dry_run" -eq 0 ]; then
  san=$(command -v compute-sanitizer || true)
  for c in /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -z "$san" ] && [ -x "$c" ] && san=$c
  done
  SAN_LOG=$LOG/sanitizer.log
  : >"$SAN_LOG"
  for tool in memcheck racecheck; do
    if [ -z "$san" ]; then
      result "$tool" UNAVAILABLE "compute-sanitizer not found"
      continue
    fi
    t0=$SECONDS
    echo "=== $tool" >>"$SAN_LOG"
    run timeout 600 "$san" --tool "$tool" --error-exitcode 99 \
      "$P/bin/tests/cuda_backend_test" --gtest_filter="$SAN_FILTER" \
      >"$WORK/$tool.log" 2>&1
    code=$?
    cat "$WORK/$tool.log" >>"$SAN_LOG"
    errors=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$WORK/$tool.log" |
      tail -1)
    if grep -qiE 'device not supported|not supported on this platform' \
      "$WORK/$tool.log"; then
      result "$tool" UNAVAILABLE "$(grep -iE 'not supported' "$WORK/$tool.log" |
        head -1)"
    elif [ "$code" -eq 0 ]; then
      result "$tool" PASS "${errors:-no summary} ($((SECONDS - t0))s)"
    else
      result "$tool" FAIL "exit $code: ${errors:-see sanitizer.log}"
      grep -E '^========= (Invalid|Error|Race|Warning)' "$WORK/$tool.log" |
        head -10 | tee -a "$SUMMARY"
    fi
  done
fi

# ---------------------------------------------------------------------------
# End to end, through scripts/launch.sh with the packed binaries and data.
E2E_LOG=$LOG/e2e.log
if [ "$dry_run" -eq 0 ]; then
  e2e_args=(--backend cuda --epochs=1)
else  # a short CPU job: the binaries, the data and launch.sh work
  e2e_args=(--backend cpu --epochs=1 --max_steps=30)
fi
mkdir -p "$WORK/tmp"
t0=$SECONDS
# Metrics on for every process (dp-ps 9400, workers 9401, 9402), each scraped
# once while the job runs.
METRICS=9400
LD_LIBRARY_PATH=$LDP BIN=$P/bin TMPDIR=$WORK/tmp timeout 600 scripts/launch.sh \
  --workers 2 --data_dir "$P/data/fashion-mnist" --dataset=fashion-mnist \
  --batch_size=64 --seed=1 --metrics_port "$METRICS" "${e2e_args[@]}" \
  >"$E2E_LOG" 2>&1 &
launch_pid=$!
scraped=""
while kill -0 "$launch_pid" 2>/dev/null && [ "$(echo "$scraped" | wc -w)" -lt 3 ]; do
  for port in $METRICS $((METRICS + 1)) $((METRICS + 2)); do
    case " $scraped " in *" $port "*) continue ;; esac
    if python3 -c 'import sys, urllib.request
body = urllib.request.urlopen(sys.argv[1], timeout=2).read().decode()
sys.exit(0 if "dp_build_info" in body else 1)' \
      "http://127.0.0.1:$port/metrics" 2>/dev/null; then
      scraped="$scraped $port"
    fi
  done
  sleep 0.5
done
wait "$launch_pid"
code=$?
for f in "$WORK"/tmp/dp-run-*/worker-*.log; do
  [ -f "$f" ] && { echo "=== $(basename "$f")"; cat "$f"; } >>"$E2E_LOG"
done
accuracy=$(sed -n 's/.*final test accuracy: \([0-9.]*\).*/\1/p' "$E2E_LOG" |
  tail -1)
done_line=$(grep -o 'done: .*' "$E2E_LOG" | tail -1)
backend_line=$(grep -o 'backend cuda[^,]*' "$E2E_LOG" | head -1)
if [ "$code" -ne 0 ]; then
  result e2e FAIL "launch.sh exit $code; $(grep -iE 'error|fail' "$E2E_LOG" |
    head -3 | tr '\n' ' ')"
elif [ "$dry_run" -eq 1 ]; then
  result e2e PASS "short CPU job from the pack: ${done_line:-?} ($((SECONDS - t0))s)"
elif [ -z "$accuracy" ]; then
  result e2e FAIL "no final test accuracy in e2e.log"
elif [ -z "$backend_line" ]; then
  result e2e FAIL "the workers did not report a cuda backend"
elif [ "$(echo "$scraped" | wc -w)" -ne 3 ]; then
  result e2e FAIL "not every /metrics answered while training (scraped:$scraped)"
elif awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.84) }'; then
  result e2e PASS "accuracy $accuracy >= 0.84; $done_line; $backend_line; /metrics:$scraped ($((SECONDS - t0))s)"
else
  result e2e FAIL "accuracy $accuracy < 0.84; $done_line"
fi

# ---------------------------------------------------------------------------
# Benchmark: dp (gpu_bench) against torch eager, as torch_ms / dp_ms.
BENCH_LOG=$LOG/bench.log
if [ "$dry_run" -eq 1 ]; then
  if python3 -c 'import py_compile, sys
py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)' \
    bench/torch_gpu_bench.py "$WORK/bench.pyc" 2>"$WORK/err"; then
    result bench PASS "dry run: torch_gpu_bench.py compiles; gpu_bench needs a GPU"
  else
    result bench FAIL "torch_gpu_bench.py: $(cat "$WORK/err")"
  fi
  finish
fi
t0=$SECONDS
run timeout 300 "$P/bin/bench/gpu_bench" --csv="$WORK/dp.csv" >"$BENCH_LOG" 2>&1
dp_code=$?
# torch runs with its own libraries: no LD_LIBRARY_PATH from the pack.
PYTHONUNBUFFERED=1 timeout 300 python3 bench/torch_gpu_bench.py \
  --csv="$WORK/torch.csv" >>"$BENCH_LOG" 2>&1
torch_code=$?
if [ "$dp_code" -ne 0 ] || [ "$torch_code" -ne 0 ]; then
  result bench FAIL "gpu_bench exit $dp_code, torch_gpu_bench exit $torch_code"
  finish
fi
python3 - "$WORK/dp.csv" "$WORK/torch.csv" "$done_line" >"$WORK/ratio.txt" <<'EOF'
import csv, sys
rows = {}
for path in sys.argv[1:3]:
    for r in csv.DictReader(open(path)):
        rows[(r["impl"], r["mode"], int(r["batch"]))] = float(r["median_ms"])
print("forward+backward, median ms per step (speedup = torch / dp)")
print(f"{'batch':>6} {'dp mode':<8} {'dp ms':>9} {'torch mode':<10} "
      f"{'torch ms':>9} {'speedup':>8}")
worst = None
for batch in sorted({k[2] for k in rows}):
    for dp_mode, torch_mode in (("compute", "compute"), ("eager", "compute"),
                                ("step", "step")):
        d = rows.get(("dp", dp_mode, batch))
        t = rows.get(("torch", torch_mode, batch))
        if d is None or t is None:
            continue
        print(f"{batch:>6} {dp_mode:<8} {d:>9.4f} {torch_mode:<10} {t:>9.4f} "
              f"{t / d:>7.2f}x")
        if dp_mode == "compute" and batch in (512, 4096):
            worst = t / d if worst is None else min(worst, t / d)
print(f"target: compute at batch 512 and 4096 >= 1.30x; worst {worst:.2f}x"
      if worst is not None else "target: no data")
if len(sys.argv) > 3 and sys.argv[3]:
    print(f"end-to-end job: {sys.argv[3]}")
sys.exit(0 if worst is not None and worst >= 1.3 else 3)
EOF
ratio_code=$?
cat "$WORK/ratio.txt" | tee -a "$BENCH_LOG" | tee -a "$SUMMARY"
if [ "$ratio_code" -eq 0 ]; then
  result bench PASS "target met ($((SECONDS - t0))s)"
else
  result bench FAIL "speedup target (1.3x at 512 and 4096) not met"
fi
finish
