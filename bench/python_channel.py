#!/usr/bin/env python3
"""The Python worker's step over shared memory, through the step channel
against one PushPull call per step: dp-ps with 2 Python workers
(tests/python/job_worker.py, the MLP on Fashion-MNIST, batch 2 x 16),
the two alternated round by round; dp-ps's samples/s while training,
median of the rounds, and the channel's rate over the call's.

Usage: bench/python_channel.py BUILD_DIR [ROUNDS] [STEPS]
"""

import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import harness  # noqa: E402


def rate(ps_binary, steps, worker_flags):
    ps, address = harness.start_ps(ps_binary, ["--workers=2", "--micro_batch=16", "--global_batch=32",
                                               f"--max_steps={steps}", "--seed=3", "--min_workers=2",
                                               "--exit_when_done"])
    if address is None:
        sys.exit("dp-ps did not start")
    workers = [harness.start_python_worker(f"python worker {i}", address,
                                           ["--data_plane", "shm", "--no_test_set"] + worker_flags)
               for i in range(2)]
    line = ps.wait_line(r"([0-9.]+) samples/s while training", timeout=600)
    for w in workers:
        w.p.wait()
    ps.p.wait()
    if line is None:
        ps.show()
        sys.exit("dp-ps did not finish")
    return float(line.group(1))


def main():
    build = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 600
    ps_binary = os.path.join(build, "server", "dp-ps")
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
