#!/usr/bin/env python3
"""A Python worker of the tests' jobs: dp_ps.train of an MLP (fc1..fc3,
784-256-128-10 or --widths) or a small CNN on Fashion-MNIST, torch made
deterministic, one thread. Prints `summary {json}` at the end; a
dp_ps.errors exception prints `error <class>: <message>` and exits with its
exit_code.

Usage: job_worker.py --ps ADDR [--model mlp|mlp_last_first|cnn] [--rank R] [--token T]
       [--data_id S] [--metrics_port P] [--tls_ca F --tls_cert F --tls_key F]
       [--data_plane auto|grpc|shm] [--no_step_channel] [--spin_us US] [--retry_for_s S] [--pause_at_step N]
"""

import argparse
import json
import os
import signal
import sys

import torch

import models
import dp_ps


def hold_before_push(step):
    """The tests' event: this process stops itself (SIGSTOP) once, before it
    pushes `step`, so that a test acts while the job waits for it."""
    push = dp_ps.Worker.push

    def held_push(self, gradient, loss):
        if self.step == step and not held_push.done:
            held_push.done = True
            print(f"rank {self.rank}: pausing before the push of step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return push(self, gradient, loss)
    held_push.done = False
    dp_ps.Worker.push = held_push


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ps", required=True)
    p.add_argument("--model", default="mlp", choices=["mlp", "mlp_last_first", "cnn"])
    p.add_argument("--widths", default="784,256,128,10")
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--token")
    p.add_argument("--data_id")
    p.add_argument("--metrics_port", type=int, default=0)
    p.add_argument("--tls_ca")
    p.add_argument("--tls_cert")
    p.add_argument("--tls_key")
    p.add_argument("--no_test_set", action="store_true")
    p.add_argument("--data_plane", default="auto", choices=["auto", "grpc", "shm"])
    p.add_argument("--no_step_channel", action="store_true")
    p.add_argument("--spin_us", type=float, default=300)
    # The library's default: with four torch workers starting on two loaded
    # cores, dp-ps's first answer once took over 30 s (a test's deadline
    # is run_job's, not this).
    p.add_argument("--retry_for_s", type=float, default=120)
    p.add_argument("--pause_at_step", type=int, default=-1)
    a = p.parse_args()
    if a.pause_at_step >= 0:
        hold_before_push(a.pause_at_step)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    model = models.make(a.model, a.widths)
    tls = None
    if a.tls_ca or a.tls_cert:
        tls = {"ca": a.tls_ca, "cert": a.tls_cert, "key": a.tls_key}
    try:
        summary = dp_ps.train(model, dp_ps.IdxDataset(), a.ps,
                              test_set=None if a.no_test_set else dp_ps.IdxDataset(split="test"),
                              rank=a.rank, token=a.token, data_id=a.data_id,
                              metrics_port=a.metrics_port, tls=tls, retry_for_s=a.retry_for_s,
                              data_plane=a.data_plane, step_channel=not a.no_step_channel,
                              spin_us=a.spin_us)
    except dp_ps.errors.DpError as e:
        print(f"error {type(e).__name__}: {e}", flush=True)
        return e.exit_code
    print("summary " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
