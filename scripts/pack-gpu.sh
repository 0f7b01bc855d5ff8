#!/usr/bin/env bash
# Builds the CUDA tree here and packs what scripts/gpu-check.sh needs on a GPU
# machine that has CUDA 13, cmake, ninja and python3+torch but none of our
# Debian libraries (gRPC, protobuf, Abseil, prometheus-cpp, OpenBLAS, ...):
# the stripped binaries, every shared library they load except glibc's own and
# the CUDA/driver ones (which that machine has), and Fashion-MNIST.
# Output: gpu-pack/dp-gpu.tar.xz (ignored by git; must stay well under 64 MiB,
# the most a working tree may carry to the GPU machine), listed in
# gpu-pack/MANIFEST.
#
# Usage: scripts/pack-gpu.sh    (BUILD_DIR=build, PACK_DIR=gpu-pack,
#                                DATA_DIR=/usr/share/datasets/fashion-mnist)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
PACK_DIR=${PACK_DIR:-gpu-pack}
DATA_DIR=${DATA_DIR:-/usr/share/datasets/fashion-mnist}
MAX_MIB=${MAX_MIB:-60}  # leaves room for the source tree itself

# name in the build dir -> path in the pack (scripts/launch.sh expects
# BIN/server/dp-ps and BIN/worker/dp-worker; dp-worker finds the CUDA module
# next to itself).
declare -A BINARIES=(
  [server/dp-ps]=bin/server/dp-ps
  [worker/dp-worker]=bin/worker/dp-worker
  [worker/libdp_cuda.so]=bin/worker/libdp_cuda.so
  [tests/cuda_module_check.py]=bin/tests/cuda_module_check.py
  [tests/cuda_backend_test]=bin/tests/cuda_backend_test
  [tests/cpu_backend_test]=bin/tests/cpu_backend_test
  [bench/gpu_bench]=bin/bench/gpu_bench
)

# Libraries the GPU machine provides itself: glibc's, and CUDA's and the
# driver's (taking ours would break the match with its driver).
is_system_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libpthread.so* | \
      libdl.so* | librt.so* | libutil.so* | libresolv.so* | libcuda.so* | \
      libcudart.so* | libcublas*.so* | libnvidia*.so* | libnvrtc*.so* | \
      libnvJitLink*.so*)
      return 0 ;;
  esac
  return 1
}
# Packed apart and used only where the machine's own are older than ours.
is_compat_lib() {
  case "$1" in libstdc++.so* | libgcc_s.so*) return 0 ;; esac
  return 1
}

echo "pack-gpu: building in $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
if ! grep -q 'cuda_backend.cu' "$BUILD_DIR/build.ninja"; then
  echo "pack-gpu: $BUILD_DIR is not a CUDA build (nvcc not found?)" >&2
  exit 1
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target dp-ps dp-worker \
  dp_cuda cuda_backend_test cpu_backend_test gpu_bench
cp tests/cuda_module_check.py "$BUILD_DIR/tests/"

stage=$(mktemp -d "${TMPDIR:-/tmp}/dp-gpu-pack-XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/dp-gpu"
mkdir -p "$root/lib" "$root/lib-compat" "$root/data/fashion-mnist"

for b in "${!BINARIES[@]}"; do
  dst="$root/${BINARIES[$b]}"
  mkdir -p "$(dirname "$dst")"
  cp "$BUILD_DIR/$b" "$dst"
  case "$b" in *.py) continue ;; esac
  strip --strip-unneeded "$dst"
done

# Every library ldd resolves (transitively), copied under its soname.
missing=0
while read -r name path; do
  if is_system_lib "$name"; then continue; fi
  if [ "$path" = "not" ]; then
    echo "pack-gpu: $name is not found here" >&2
    missing=1
    continue
  fi
  dir=lib
  if is_compat_lib "$name"; then dir=lib-compat; fi
  cp -L "$path" "$root/$dir/$name"
  strip --strip-unneeded "$root/$dir/$name" 2>/dev/null || true
done < <(for b in "${!BINARIES[@]}"; do
  case "$b" in *.py) ;; *) ldd "$BUILD_DIR/$b" ;; esac
done |
  awk '$2 == "=>" {print $1, $3}' | sort -u)
[ "$missing" -eq 0 ] || exit 1

for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz \
  t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  cp "$DATA_DIR/$f" "$root/data/fashion-mnist/$f"
done

# The newest glibc symbol version anything in the pack needs: the GPU
# machine's glibc must be at least that.
newest() {  # newest symbol version $1 (GLIBC, GLIBCXX) needed by files in $2...
  local tag=$1
  shift
  find "$@" -type f ! -name '*.py' -exec objdump -T {} + 2>/dev/null |
    grep -o "${tag}_[0-9.]*" | sort -uV | tail -1
}
glibc_needed=$(newest GLIBC "$root/bin" "$root/lib")
glibcxx_needed=$(newest GLIBCXX "$root/bin" "$root/lib")
compat_glibc=$(newest GLIBC "$root/lib-compat")
{
  echo "dp-gpu pack: $(git describe --always --dirty 2>/dev/null || echo unknown)" \
    "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "needs: glibc >= ${glibc_needed#GLIBC_}, libstdc++ with $glibcxx_needed" \
    "(else lib-compat/, which needs glibc >= ${compat_glibc#GLIBC_})," \
    "CUDA 13 runtime + cuBLAS + a driver for them"
  (cd "$stage" && find dp-gpu -type f -printf '%s\t%p\n' | sort -k2)
} >"$stage/MANIFEST"
cp "$stage/MANIFEST" "$root/MANIFEST"

mkdir -p "$PACK_DIR"
rm -f "$PACK_DIR/dp-gpu.tar.xz"
XZ_OPT="-6 -T${JOBS:-$(nproc)}" tar -C "$stage" -cJf "$PACK_DIR/dp-gpu.tar.xz" dp-gpu
cp "$stage/MANIFEST" "$PACK_DIR/MANIFEST"

raw=$(du -sb "$root" | cut -f1)
packed=$(du -sb "$PACK_DIR" | cut -f1)
echo "pack-gpu: $(find "$root/lib" "$root/lib-compat" -type f | wc -l) libraries," \
  "$((raw / 1048576)) MiB unpacked, $PACK_DIR/ is $((packed / 1048576)) MiB" \
  "($packed bytes); needs glibc >= ${glibc_needed#GLIBC_}"
if [ "$packed" -gt $((MAX_MIB * 1048576)) ]; then
  echo "pack-gpu: $PACK_DIR/ is over $MAX_MIB MiB" >&2
  exit 1
fi
