#!/usr/bin/env python3
"""PyTorch eager SimpleNet forward+backward on the GPU: the baseline of
bench/gpu_bench.cc, same batches, same modes, same table and CSV rows
(impl,mode,batch,median_ms,min_ms). fp32 with TF32 off unless --tf32.

Modes (as gpu_bench):
  compute  batch already on the GPU: zero grads, forward, mean cross-entropy,
           backward, synchronize
  step     what a worker does: x from pageable host memory to the GPU, the
           above, then the flat gradient back to host memory
Never asserts on time.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from simplenet_torch import SimpleNet


def time_steps(step, repeats, iters):
    for _ in range(max(5, iters // 5)):
        step()
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        ms.append((time.perf_counter() - t0) * 1e3 / iters)
    return statistics.median(ms), min(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="64,512,4096")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    dev = torch.device("cuda")
    torch.manual_seed(1)
    model = SimpleNet().to(dev)
    params = list(model.parameters())
    macs_per_sample = 2 * 784 * 256 + 3 * 256 * 128 + 3 * 128 * 10

    rows = []
    print(f"torch {torch.__version__} eager ({torch.cuda.get_device_name()}), "
          f"SimpleNet 784-256-128-10, fp32{' (TF32 on)' if args.tf32 else ''}, "
          f"{args.repeats} repeats x {args.iters} steps")
    print(f"{'batch':>8} {'mode':<8} {'median ms':>11} {'min ms':>11} "
          f"{'samples/s':>12} {'TFLOP/s':>9}")
    for batch in batches:
        x_host = torch.randn(batch, 784)  # pageable, as a worker's data
        y_host = torch.randint(0, 10, (batch,))
        x_dev, y_dev = x_host.to(dev), y_host.to(dev)
        grad_host = torch.empty(sum(p.numel() for p in params))

        def compute():
            for p in params:
                p.grad = None
            loss = F.cross_entropy(model(x_dev), y_dev)
            loss.backward()
            torch.cuda.synchronize()

        def step():
            for p in params:
                p.grad = None
            x, y = x_host.to(dev), y_host.to(dev)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            grad_host.copy_(flat)  # synchronizes
            loss.item()

        for name, fn in (("compute", compute), ("step", step)):
            med, mn = time_steps(fn, args.repeats, args.iters)
            tflops = 2.0 * macs_per_sample * batch / (med * 1e-3) / 1e12
            print(f"{batch:>8} {name:<8} {med:>11.4f} {mn:>11.4f} "
                  f"{batch / (med * 1e-3):>12.0f} {tflops:>9.2f}")
            rows.append(f"torch,{name},{batch},{med:.6f},{mn:.6f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("impl,mode,batch,median_ms,min_ms\n")
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
