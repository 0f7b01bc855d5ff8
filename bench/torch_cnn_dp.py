#!/usr/bin/python3
"""The README's CNN (python/examples/fashion_cnn.py) on Fashion-MNIST:
samples/s of 2 Python workers through dp-ps (batch 32 each; over shared
memory, and over gRPC), against PyTorch DDP (gloo, 2 processes of batch 32)
and one process of batch 64, one thread each, in one run: the four
configurations one after another
per repeat, so that the machine's drift hits them alike; medians, and
ratios against DDP. dp-ps's rate is its own ("samples/s while training",
from its first update to its last); torch_ddp.py's from its first step on.

Usage (after scripts/build.sh): bench/torch_cnn_dp.py [--repeats 3] [--steps 300]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
EXAMPLE = os.path.join(ROOT, "python", "examples", "fashion_cnn.py")
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")


def through_dp_ps(steps, d, plane):
    init = os.path.join(d, "init.safetensors")
    subprocess.run([sys.executable, EXAMPLE, "init", init], check=True, env=ENV)
    ps = subprocess.Popen([os.path.join(ROOT, "build", "server", "dp-ps"), "--host=127.0.0.1",
                           "--port=0", "--workers=2", "--batch_size=32", f"--max_steps={steps}",
                           f"--init_model={init}"], stderr=subprocess.PIPE, text=True)
    lines = []
    for line in ps.stderr:
        lines.append(line)
        m = re.search(r"listening on [^:]+:(\d+)", line)
        if m:
            break
    address = f"127.0.0.1:{m.group(1)}"
    workers = [subprocess.Popen([sys.executable, EXAMPLE, "train", address, plane], env=ENV,
                                stdout=subprocess.DEVNULL) for _ in range(2)]
    lines += ps.stderr.readlines()
    for w in workers:
        w.wait()
    ps.wait()
    rate = re.search(r" ([0-9.]+) samples/s while training", "".join(lines))
    if ps.returncode != 0 or rate is None:
        raise SystemExit("dp-ps job failed:\n" + "".join(lines[-20:]))
    return float(rate.group(1))


def torch_run(mode, steps):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "torch_ddp.py"), "--model=cnn",
                          f"--mode={mode}", "--workers=2", "--batch=32", f"--max_steps={steps}"],
                         check=True, env=ENV, stdout=subprocess.PIPE, text=True).stdout
    return float(re.search(r"samples_per_s=([0-9.]+)", out).group(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    rates = {"dp-ps, 2 workers, shm": [], "dp-ps, 2 workers, gRPC": [], "DDP gloo, 2 processes": [],
             "one process, batch 64": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.repeats):
            rates["dp-ps, 2 workers, shm"].append(through_dp_ps(a.steps, d, "shm"))
            rates["dp-ps, 2 workers, gRPC"].append(through_dp_ps(a.steps, d, "grpc"))
            rates["DDP gloo, 2 processes"].append(torch_run("ddp", a.steps))
            rates["one process, batch 64"].append(torch_run("single", a.steps))
            print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()), flush=True)
    ddp = statistics.median(rates["DDP gloo, 2 processes"])
    print(f"the README's CNN, {a.steps} steps of 64 samples, medians of {a.repeats} (samples/s):")
    for k, v in rates.items():
        print(f"  {k:26s} {statistics.median(v):8.0f}  {statistics.median(v) / ddp:.2f}x DDP")


if __name__ == "__main__":
    main()
