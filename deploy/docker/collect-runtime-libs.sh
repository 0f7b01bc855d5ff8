#!/bin/sh
# Copies the shared libraries that BINARY needs into DIR, except those the
# CUDA runtime image provides: the C and C++ runtimes and CUDA's own.
# Usage: collect-runtime-libs.sh BINARY DIR
set -eu
binary=$1
out=$2
mkdir -p "$out"
# "libname.so.N => /path/libname.so.N (0x...)"; ldd fails on a missing one.
if ldd "$binary" | grep -q "not found"; then
  ldd "$binary" >&2
  exit 1
fi
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  while read -r name path; do
    case "$name" in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | \
        libgcc_s.so.* | libstdc++.so.* | ld-linux*) ;;
      libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | \
        libnvidia-*.so.* | libnvJitLink.so.*) ;;
      *) cp -L "$path" "$out/$name" ;;
    esac
  done
