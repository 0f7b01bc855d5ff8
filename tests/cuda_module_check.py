#!/usr/bin/env python3
"""The packaging promises of the CUDA module, checked on the built files.

1. dp-worker needs no CUDA library (its DT_NEEDED entries): one
   binary for CPU and GPU hosts, and cuBLAS's thread-local storage never sits
   in the static TLS block that civetweb's small thread stacks must hold.
2. libdp_cuda.so holds machine code and PTX for exactly the architectures
   the build asked for (--architectures, CMAKE_CUDA_ARCHITECTURES), read
   from its .nv_fatbin section.
3. dp-worker says which backend it chose and why, and --backend=cuda that
   cannot run here is exit code 5 with the reason (where no GPU is usable),
   a missing module exit code 2.

Usage: cuda_module_check.py --worker PATH --module PATH --architectures LIST
Prints one line per check and 'N passed, N failed'; exit 1 on any failure.
"""
import argparse
import re
import struct
import subprocess
import sys

CUDA_LIBS = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|nvrtc|nvJitLink)\.so")

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")


def section(path, wanted):
    """Bytes of section `wanted` of a little-endian ELF64 file."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path} is not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
               for i in range(shnum)]
    names_off = headers[shstrndx][4]
    for name_off, _, _, _, offset, size in headers:
        end = data.index(b"\0", names_off + name_off)
        if data[names_off + name_off:end].decode() == wanted:
            return data[offset:offset + size]
    return None


def needed(path):
    """DT_NEEDED entries of an ELF64 file (no binutils needed)."""
    dynamic, names = section(path, ".dynamic"), section(path, ".dynstr")
    out = []
    for pos in range(0, len(dynamic), 16):
        tag, value = struct.unpack_from("<qQ", dynamic, pos)
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED
            out.append(names[value:names.index(b"\0", value)].decode())
    return out


def fatbin_entries(blob):
    """(kind, arch) of every entry of every fatbin in a .nv_fatbin section.

    A fatbin is a header (magic 0xBA55ED50, version u16, header size u16,
    payload size u64) and entries, each a header (kind u16: 1 PTX, 2 ELF;
    version u16; header size u32; payload size u64; ...; arch u32 at byte 28)
    followed by its payload.
    """
    entries, pos = [], 0
    while pos + 16 <= len(blob):
        magic, _, header, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != 0xBA55ED50:
            pos += 8  # fatbins are 8-byte aligned in the section
            continue
        off, end = pos + header, pos + header + size
        per_fatbin = []
        while off < end:
            kind, _, ehdr, esize = struct.unpack_from("<HHIQ", blob, off)
            arch, = struct.unpack_from("<I", blob, off + 28)
            per_fatbin.append((kind, arch))
            off += ehdr + esize
        entries.append(per_fatbin)
        pos = end
    return entries


def run_worker(worker, *flags):
    p = subprocess.run([worker, "--rank=0", "--ps=127.0.0.1:1",
                        "--retry_for_s=0", *flags],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def gpu_present():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--module", required=True)
    ap.add_argument("--architectures", required=True,
                    help="the build's CMAKE_CUDA_ARCHITECTURES, e.g. "
                         "'75-real,...,120-real,120-virtual' or '90'")
    args = ap.parse_args()
    # "N-real": machine code only; "N-virtual": PTX only; "N": both.
    sass, ptx = set(), set()
    for arch in filter(None, args.architectures.replace(",", ";").split(";")):
        number, _, kind = arch.partition("-")
        if kind != "virtual":
            sass.add(int(number))
        if kind != "real":
            ptx.add(int(number))

    cuda_needed = [n for n in needed(args.worker) if CUDA_LIBS.match(n)]
    check("dp-worker links no CUDA library", not cuda_needed,
          ", ".join(cuda_needed))
    module_needed = needed(args.module)
    check("the module links cudart and cuBLAS",
          "libcudart.so.13" in module_needed and "libcublas.so.13" in module_needed,
          ", ".join(module_needed))

    blob = section(args.module, ".nv_fatbin")
    fatbins = fatbin_entries(blob) if blob else []
    check("the module has CUDA code", bool(fatbins))
    for i, entries in enumerate(fatbins):
        has_sass = {arch for kind, arch in entries if kind == 2}
        has_ptx = {arch for kind, arch in entries if kind == 1}
        check(f"fatbin {i}: sm_{sorted(has_sass)} PTX compute_{sorted(has_ptx)}",
              has_sass == sass and has_ptx == ptx,
              f"want sm_{sorted(sass)} and PTX compute_{sorted(ptx)}")

    code, out = run_worker(args.worker, "--backend=cuda",
                           "--cuda_module=/nonexistent/libdp_cuda.so")
    check("a missing module is exit 2 naming the file",
          code == 2 and "/nonexistent/libdp_cuda.so" in out, f"exit {code}")
    code, out = run_worker(args.worker, "--backend=auto",
                           f"--cuda_module={args.module}")
    line = re.search(r"backend: (.*)", out)
    check("--backend=auto logs its choice", line is not None,
          line.group(1) if line else out[-500:])
    if not gpu_present():
        code, out = run_worker(args.worker, "--backend=cuda",
                               f"--cuda_module={args.module}")
        check("--backend=cuda without a GPU is exit 5 (cannot run here), "
              "with the reason",
              code == 5 and 'backend "cuda": ' in out, f"exit {code}")
        check("--backend=auto without a GPU says why it chose the CPU",
              line is not None and line.group(1).startswith("cpu (auto: "))
    else:
        check("--backend=auto on a GPU host chooses cuda",
              line is not None and line.group(1).startswith("cuda on GPU "))

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
