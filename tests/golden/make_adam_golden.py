#!/usr/bin/env python3
"""Writes what torch.optim.Adam and AdamW themselves make of known sequences
of gradients, for tests/adam_test.cc: one file per run below (RUNS).

The parameters and gradients are not stored: both sides generate them from
(step, index) with the integer hash below, exactly, as float32 bit patterns
(magnitudes 2^-30 to 2^11, signs and exact zeros mixed). Each file holds,
after the run's steps, the parameters, exp_avg and exp_avg_sq: 3 * N
float32, little-endian, in that order.

adam_golden.f32: torch.optim.Adam's defaults, 160 steps.
adam_l2_golden.f32: Adam with weight decay (L2: added to the gradient).
adamw_golden.f32: AdamW (decoupled weight decay), other betas and eps.
cosine_clip_golden.f32, step_clip_golden.f32: a few steps of AdamW with
warm-up and cosine decay, and of Adam with warm-up and step decay, each
step's gradient clipped first by clip_grad_norm_'s rule. The gradient of
step t is scaled by 2^-(8 * (t mod 3)), exactly, so that some steps clip
and some do not. The rate of update t (0-based) is set on the group as
dp-ps computes it (server/lr_schedule.h), which is LambdaLR's to a few ulps
of a double (checked below); the global norm is summed in double in element
order, as dp-ps does (torch sums it in float32), then clipped by torch's own
expressions from that float32 norm.

Regenerate (Debian's python3-torch 1.13.1, its AVX2 kernels pinned so that
the result does not depend on the machine's vector width):
  ATEN_CPU_CAPABILITY=avx2 /usr/bin/python3 tests/golden/make_adam_golden.py
"""
import math
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


def scheduled_lr(run, t):
    """The rate of update t (0-based), as server/lr_schedule.cc has it."""
    lr, warmup = run["lr"], run.get("warmup", 0)
    warm = min(1.0, (t + 1) / warmup) if warmup > 0 else 1.0
    kind = run.get("schedule", "constant")
    if kind == "cosine":
        lr_min = run["lr_min"]
        base = lr_min + (lr - lr_min) * 0.5 * (
            1 + math.cos(math.pi * t / run["steps"]))
    elif kind == "step":
        base = lr * run["gamma"] ** (t // run["step_every"])
    else:
        base = lr
    return warm * base


def gradient(run, t):
    g = values(t, N, 97, 42)
    if run.get("clip", 0) > 0:
        g = g * np.float32(2.0 ** (-8 * (t % 3)))  # exact: no subnormals
    return torch.from_numpy(g.copy())


def clip(grad, max_norm):
    """clip_grad_norm_'s coefficient and product, from a norm summed in
    double in element order (np.cumsum adds in order; np.sum would not)."""
    squares = grad.numpy().astype(np.float64) ** 2
    total_norm = torch.tensor(math.sqrt(np.cumsum(squares)[-1]),
                              dtype=torch.float32)
    clip_coef = max_norm / (total_norm + 1e-6)
    clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
    grad.mul_(clip_coef_clamped)
    return bool(clip_coef < 1)


def train(run):
    p = torch.nn.Parameter(torch.from_numpy(values(0, N, 117, 10).copy()))
    optimizer = torch.optim.AdamW if run.get("adamw") else torch.optim.Adam
    opt = optimizer([p], lr=run["lr"], betas=run.get("betas", (0.9, 0.999)),
                    eps=run.get("eps", 1e-8),
                    weight_decay=run.get("weight_decay", 0.0), foreach=False)
    base_lr = run["lr"]
    reference = torch.optim.lr_scheduler.LambdaLR(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr),
        lambda t: scheduled_lr(run, t) / base_lr)
    clipped = 0
    for t in range(run["steps"]):
        lr = scheduled_lr(run, t)
        assert abs(reference.get_last_lr()[0] - lr) <= 1e-15 * lr, (t, lr)
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = gradient(run, t + 1)
        if run.get("clip", 0) > 0:
            clipped += clip(p.grad, run["clip"])
        opt.step()
        reference.optimizer.step()
        reference.step()
    state = opt.state[p]
    out = np.concatenate([p.detach().numpy(), state["exp_avg"].numpy(),
                          state["exp_avg_sq"].numpy()]).astype("<f4")
    return out, clipped


# Each run's settings; tests/adam_test.cc states the same ones.
RUNS = {
    "adam_golden.f32": dict(lr=1e-3, steps=STEPS),
    "adam_l2_golden.f32": dict(lr=2e-3, weight_decay=0.01, steps=STEPS),
    "adamw_golden.f32": dict(lr=1e-3, adamw=True, weight_decay=0.1,
                             betas=(0.8, 0.99), eps=1e-6, steps=STEPS),
    "cosine_clip_golden.f32": dict(lr=1e-2, adamw=True, weight_decay=0.05,
                                   betas=(0.85, 0.98), eps=1e-7,
                                   schedule="cosine", warmup=5, lr_min=1e-4,
                                   clip=1.0, steps=40),
    "step_clip_golden.f32": dict(lr=1e-2, weight_decay=0.01,
                                 schedule="step", warmup=3, step_every=7,
                                 gamma=0.5, clip=1.0, steps=40),
}


def main():
    torch.set_num_threads(1)
    capability = (torch.backends.cpu.get_cpu_capability()
                  if hasattr(torch.backends, "cpu") else "cpu")
    for name, run in RUNS.items():
        out, clipped = train(run)
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
        out.tofile(path)
        print(f"wrote {path}: torch {torch.__version__}, {capability}, "
              f"N={N}, steps={run['steps']}, clipped {clipped}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
