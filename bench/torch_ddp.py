#!/usr/bin/python3
"""The PyTorch baseline of scripts/perf.sh: SimpleNet on Fashion-MNIST (or
any MLP, --layers, on the train_x.npy/train_y.npy of --data) with
torch.optim.Adam, either one process with batch N*b or DDP (gloo) with N
processes of batch b, the same global data order as dp-ps (a permutation per
epoch, rank r takes the r-th slice of each global batch). Prints one line:
RESULT mode=... samples_per_s=... accuracy=... steps=... cpu_s=... max_rss_kb=...
(samples/s over the training phase only, after one warm-up step; steps, CPU
seconds and peak RSS are rank 0's, over its whole life: data load, training,
test). --model=cnn: the README's CNN instead of an MLP."""
import argparse
import gzip
import os
import resource
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from simplenet_torch import Mlp

# The README's CNN (python/examples/fashion_cnn.py), for --model=cnn.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "examples"))

DATA = "/usr/share/datasets/fashion-mnist"


def load(split):
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(f"{DATA}/{prefix}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{DATA}/{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def load_npy(directory):
    x = np.load(os.path.join(directory, "train_x.npy"), mmap_mode="r")
    y = np.load(os.path.join(directory, "train_y.npy"))
    return (torch.from_numpy(np.array(x, dtype=np.float32)),
            torch.from_numpy(y.astype(np.int64)))


def train(rank, world, args, port, results):
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    x, y = load_npy(args.data) if args.data else load("train")
    if args.model == "cnn":
        from fashion_cnn import Cnn
        model = Cnn()
    else:
        model = Mlp([int(d) for d in args.layers.split(",")])
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    b = args.batch
    global_batch = b * world
    steps_per_epoch = len(x) // global_batch
    gen = torch.Generator().manual_seed(args.seed)
    step = 0
    start = None
    for _ in range(args.epochs):
        order = torch.randperm(len(x), generator=gen)
        for g in range(steps_per_epoch):
            idx = order[g * global_batch + rank * b:g * global_batch + (rank + 1) * b]
            opt.zero_grad()
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            step += 1
            if step == 1:
                start = time.perf_counter()
            if step == args.max_steps:
                break
        if step == args.max_steps:
            break
    elapsed = time.perf_counter() - start
    if rank == 0:
        accuracy = 0.0  # --data: the training files only
        if not args.data:
            tx, ty = load("test")
            with torch.no_grad():
                accuracy = (model(tx).argmax(1) == ty).float().mean().item()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        results.put(((step - 1) * global_batch / elapsed, accuracy, step,
                     usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "single"], default="ddp")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per process")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp",
                   help="cnn: the README's CNN (python/examples/fashion_cnn.py)")
    p.add_argument("--layers", default="784,256,128,10")
    p.add_argument("--data", default="", help="a directory of .npy files")
    p.add_argument("--max_steps", type=int, default=0, help="0: all epochs")
    args = p.parse_args()
    world = args.workers if args.mode == "ddp" else 1
    if args.mode == "single":
        args.batch *= args.workers
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=train, args=(r, world, args, port, results))
             for r in range(world)]
    for proc in procs:
        proc.start()
    rate, accuracy, steps, cpu_s, max_rss_kb = results.get()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"rank exited with {proc.exitcode}")
    print(f"RESULT mode={args.mode} samples_per_s={rate:.0f} accuracy={accuracy:.4f} "
          f"steps={steps} cpu_s={cpu_s:.3f} max_rss_kb={max_rss_kb}")


if __name__ == "__main__":
    main()
