#!/usr/bin/env python3
"""python_order: the Python port of dp-ps's data order and micro-batch tree
(python/dp_ps: random, data_order, micro_batch_tree) prints the same lines
as the C++ (tests/order_dump_main.cc): the epochs' steps and micro-batch
sample indices, the blocks SplitForWorkers plans, and tree sums of leaves
of many magnitudes, to the bit. Several schedules: shuffled or not, one or
several micro-batches, Fashion-MNIST's size.

Usage: order_test.py --ps BIN --worker BIN --source_dir DIR --order_dump BIN
"""

import struct
import subprocess
import sys

import torch

import harness
from dp_ps.data_order import BatchSampler, Schedule
from dp_ps.micro_batch_tree import split_for_workers, sum_in_tree_order
from dp_ps.random import Rng

SCHEDULES = [  # seed, num_samples, batch_size, micro_batches, epochs, shuffle
    (0, 100, 4, 3, 2, 1),
    (42, 60000, 64, 2, 2, 1),
    (7, 1000, 10, 8, 3, 1),
    (123456789012345, 997, 5, 5, 1, 0),
    (2**64 - 1, 50, 1, 1, 2, 1),
]


def python_lines(seed, n, batch, k, epochs, shuffle):
    s = Schedule(num_samples=n, world_size=k, batch_size=batch, micro_batches=k, epochs=epochs,
                 seed=seed, shuffle=bool(shuffle))
    lines = [f"steps {s.steps_per_epoch()} {s.total_steps()}"]
    sampler = BatchSampler(s)
    for e in range(epochs):
        for step in (e * s.steps_per_epoch(), e * s.steps_per_epoch() + 1, (e + 1) * s.steps_per_epoch() - 1):
            if step >= s.total_steps():
                continue
            for j in range(k):
                lines.append(" ".join(["indices", str(step), str(j)] + [str(i) for i in sampler.indices(step, j)]))
    for kk in range(1, 13):
        for w in range(1, kk + 2):
            lines.append(" ".join([f"split {kk} {w}"] + [f"{b.first}:{b.count}" for b in split_for_workers(kk, w)]))
    for count in range(1, 10):
        rng = Rng(seed, 1000 + count)
        leaves = []
        for m in range(count):
            values = [(2.0 * rng.uniform() - 1.0) * (1.0 / (1 + (m * 8 + i) % 7 * 1000.0)) for i in range(8)]
            leaves.append(torch.tensor(values, dtype=torch.float32))
        out = sum_in_tree_order(leaves)
        bits = [f"{struct.unpack('<I', struct.pack('<f', v))[0]:08x}" for v in out.tolist()]
        lines.append(" ".join([f"tree {count}"] + bits))
    return lines


def main():
    a = harness.args(["--order_dump"])
    checks = harness.Checks()
    for sched in SCHEDULES:
        cpp = subprocess.run([a.order_dump] + [str(v) for v in sched], capture_output=True, text=True,
                             timeout=60, check=True).stdout.splitlines()
        py = python_lines(*sched)
        differ = [i for i, (x, y) in enumerate(zip(cpp, py)) if x != y]
        checks.check(len(cpp) == len(py) and not differ,
                     f"schedule {sched}: {len(py)} Python lines equal the C++ {len(cpp)}"
                     + (f" (first difference: C++ {cpp[differ[0]][:80]!r} vs Python {py[differ[0]][:80]!r})"
                        if differ else ""))
    # The comparison can fail: another seed gives another order.
    other = python_lines(1, 100, 4, 3, 2, 1)
    checks.check(other[1] != python_lines(0, 100, 4, 3, 2, 1)[1], "another seed, another order")
    return checks.result()


if __name__ == "__main__":
    sys.exit(main())
