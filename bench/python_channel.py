#!/usr/bin/env python3
"""The Python worker's step over shared memory, through the step channel
against one PushPull call per step: dp-ps with 2 Python workers
(tests/python/job_worker.py, the MLP on Fashion-MNIST, batch 2 x 16),
the two alternated round by round; dp-ps's samples/s while training,
median of the rounds, and the channel's rate over the call's. With
--spins US,US,...: the channel alone, its waits spinning that long before
they park (train()'s spin_us), the lengths alternated round by round; each
one's rate over the first's. With --shards K: dp-ps on K shards (each
shard's push and pull through its own channel, or calls).

Usage: bench/python_channel.py BUILD_DIR [ROUNDS] [STEPS] [--spins US,...] [--shards K]
"""

import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import harness  # noqa: E402


SHARDS = 1  # --shards K: dp-ps on K shards


def rate(ps_binary, steps, worker_flags):
    shards, addresses = harness.start_shards(
        ps_binary, ["--workers=2", "--micro_batch=16", "--global_batch=32", f"--max_steps={steps}",
                    "--seed=3", "--min_workers=2", "--exit_when_done"], SHARDS, "dp-ps")
    if addresses is None:
        sys.exit("dp-ps did not start")
    workers = [harness.start_python_worker(f"python worker {i}", ",".join(addresses),
                                           ["--data_plane", "shm", "--no_test_set"] + worker_flags)
               for i in range(2)]
    line = shards[0].wait_line(r"([0-9.]+) samples/s while training", timeout=600)
    for p in workers + shards:
        p.p.wait()
    if line is None:
        shards[0].show()
        sys.exit("dp-ps did not finish")
    return float(line.group(1))


def spins(ps_binary, rounds, steps, lengths):
    rates = {us: [] for us in lengths}
    for r in range(rounds):
        for us in lengths:
            rates[us].append(rate(ps_binary, steps, ["--spin_us", str(us)]))
        print(f"round {r + 1}: " + ", ".join(f"spin {us} us {rates[us][-1]:.0f}" for us in lengths)
              + " samples/s", flush=True)
    first = lengths[0]
    for us in lengths:
        ratios = [a / b for a, b in zip(rates[us], rates[first])]
        print(f"spin {us} us: median {statistics.median(rates[us]):.0f} samples/s, "
              f"{statistics.median(ratios):.2f}x spin {first} us (median of {rounds} rounds' ratios)")


def main():
    args = sys.argv[1:]
    global SHARDS
    lengths = None
    if "--spins" in args:
        at = args.index("--spins")
        lengths = [int(v) for v in args[at + 1].split(",")]
        del args[at:at + 2]
    if "--shards" in args:
        at = args.index("--shards")
        SHARDS = int(args[at + 1])
        del args[at:at + 2]
    build = args[0]
    rounds = int(args[1]) if len(args) > 1 else 5
    steps = int(args[2]) if len(args) > 2 else 600
    ps_binary = os.path.join(build, "server", "dp-ps")
    if lengths:
        return spins(ps_binary, rounds, steps, lengths)
    channel, call = [], []
    for r in range(rounds):
        channel.append(rate(ps_binary, steps, []))
        call.append(rate(ps_binary, steps, ["--no_step_channel"]))
        print(f"round {r + 1}: step channel {channel[-1]:.0f} samples/s, "
              f"PushPull call {call[-1]:.0f} samples/s", flush=True)
    ratios = [a / b for a, b in zip(channel, call)]
    print(f"median samples/s: step channel {statistics.median(channel):.0f}, "
          f"PushPull call {statistics.median(call):.0f}; channel / call "
          f"{statistics.median(ratios):.2f}x (median of {rounds} rounds' ratios)")


if __name__ == "__main__":
    main()
