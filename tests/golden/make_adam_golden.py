#!/usr/bin/env python3
"""Writes adam_golden.f32: what torch.optim.Adam itself makes of a known
sequence of gradients, for tests/adam_test.cc.

The parameters and gradients are not stored: both sides generate them from
(step, index) with the integer hash below, exactly, as float32 bit patterns
(magnitudes 2^-30 to 2^11, signs and exact zeros mixed). The file holds,
after STEPS steps, the parameters, exp_avg and exp_avg_sq: 3 * N float32,
little-endian, in that order.

Regenerate (Debian's python3-torch 1.13.1, its AVX2 kernels pinned so that
the result does not depend on the machine's vector width):
  ATEN_CPU_CAPABILITY=avx2 /usr/bin/python3 tests/golden/make_adam_golden.py
"""
import os
import sys

import numpy as np
import torch

N = 2048   # a multiple of 64: see adam_test.cc on PyTorch's loop tails
STEPS = 160
MASK = (1 << 64) - 1


def values(step, n, min_exp, exp_range):
    """float32 values of element 0..n-1 for `step`; the C++ test has the same."""
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (np.uint64(step) * np.uint64(0x9E3779B97F4A7C15) +
             i * np.uint64(0xBF58476D1CE4E5B9) + np.uint64(1))
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    mantissa = x & np.uint64(0x7FFFFF)
    exponent = np.uint64(min_exp) + (x >> np.uint64(23)) % np.uint64(exp_range)
    sign = (x >> np.uint64(40)) & np.uint64(1)
    bits = (sign << np.uint64(31)) | (exponent << np.uint64(23)) | mantissa
    bits = np.where(((x >> np.uint64(48)) & np.uint64(63)) == 0, 0, bits)
    return bits.astype(np.uint32).view(np.float32)


def main():
    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.from_numpy(values(0, N, 117, 10).copy()))
    opt = torch.optim.Adam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                           foreach=False)
    for t in range(1, STEPS + 1):
        p.grad = torch.from_numpy(values(t, N, 97, 42).copy())
        opt.step()
    state = opt.state[p]
    out = np.concatenate([p.detach().numpy(), state["exp_avg"].numpy(),
                          state["exp_avg_sq"].numpy()]).astype("<f4")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "adam_golden.f32")
    out.tofile(path)
    print(f"wrote {path}: torch {torch.__version__}, "
          f"{torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, 'cpu') else 'cpu'}, "
          f"N={N}, STEPS={STEPS}", file=sys.stderr)


if __name__ == "__main__":
    main()
