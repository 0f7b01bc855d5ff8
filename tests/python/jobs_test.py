#!/usr/bin/env python3
"""python_jobs_mlp, python_jobs_cnn: a job trained by Python workers (dp_ps.train) gives one
model to the byte, whoever computes it: the sha256 of dp-ps's saved model
is the same with 1, 2 and 4 Python workers, over shared memory and over
gRPC, on 1 and 2 dp-ps shards, and with a worker killed (SIGKILL) mid-job
and a new one joining. --model mlp: an MLP job; --model cnn: a CNN (two
Conv2d and a Linear) started from dp_ps.save_init's file (--init_model).
One test each, so that each has its own deadline.

Usage: jobs_test.py --ps BIN --worker BIN --source_dir DIR --model mlp|cnn
"""

import json
import os
import re
import signal
import sys

import harness
import models
import dp_ps

STEPS = 24
KILL_AT = 8


def job_flags(extra, ranks=4, started=None):
    # Four micro-batches a step whatever the number of workers: the global
    # batch, and so the model, is the job's. The first step waits for the
    # `started` workers (all ranks unless said), however long their import
    # of torch takes: the job is over in a second, and dp-ps's default wait
    # for everyone (30 s from its start) ran out under load, so that one
    # worker did every step and another arrived after dp-ps had gone (exit 4).
    return [f"--workers={ranks}", "--micro_batch=16", "--global_batch=64", f"--max_steps={STEPS}",
            "--seed=3", f"--min_workers={started or ranks}"] + extra


def workers(n, model, plane="shm"):
    return lambda address: [harness.start_python_worker(f"python worker {i}", address,
                                                        ["--model", model, "--data_plane", plane])
                            for i in range(n)]


def planes_taken(procs):
    """How each Python worker said its tensors travel."""
    return {m.group(1) for pr in procs if pr.name.startswith("python")
            for m in [re.search(r"tensors over (.*)$", pr.output(), re.M)] if m}


def channel_exchanges(procs):
    """Each Python worker's (steps it trained, push_pulls answered through
    the step channel, gRPC calls of its steps' exchanges), from its summary
    line."""
    out = []
    for pr in procs:
        m = re.search(r"^summary (.*)$", pr.output(), re.M) if pr.name.startswith("python") else None
        if m:
            s = json.loads(m.group(1))
            out.append((s["steps"], s["channel_exchanges"], s["step_calls"]))
    return out


def killed_and_replaced(model, joined_at):
    """Two workers; rank 1 killed at step KILL_AT, a new one started. Paced
    by events, not by how fast a step is: rank 0 holds itself (SIGSTOP)
    before it pushes step KILL_AT, and the step waits for its block (no
    backups, --on_worker_loss=wait); rank 1 is killed once its push of that
    step is in, and rank 0 goes on once the new process has joined."""
    def start(address):
        procs = [harness.start_python_worker(f"python worker {r}", address,
                                             ["--model", model, "--data_plane", "shm", "--rank", str(r)]
                                             + (["--pause_at_step", str(KILL_AT)] if r == 0 else []))
                 for r in range(2)]
        try:
            if not procs[0].wait_line(rf"pausing before the push of step {KILL_AT}", timeout=120):
                return procs
            if not harness.wait_until(address, lambda s: s.step == KILL_AT and 1 in s.pushed_ranks,
                                      what=f"rank 1's push of step {KILL_AT}"):
                return procs
            procs[1].p.send_signal(signal.SIGKILL)
            procs[1].p.wait()
            new = harness.start_python_worker("python worker 2 (new)", address,
                                              ["--model", model, "--data_plane", "shm"])
            joined = new.wait_line(r"rank (\d+): joined at step (\d+)", timeout=120)
            joined_at.append((int(joined.group(1)), int(joined.group(2))) if joined else None)
            return [procs[0], new]
        finally:
            # Whatever was missed, rank 0 goes on: a held process would
            # leave the job to the test's deadline instead of failing it.
            procs[0].p.send_signal(signal.SIGCONT)
    return start


def check_model(checks, d, model, extra):
    shas, planes, by_channel = {}, set(), {"shm": [], "grpc": []}
    for n in (1, 2, 4):
        shas[n], procs = harness.run_job(ARGS.ps, job_flags(extra, started=n),
                                         os.path.join(d, f"{model}-{n}.safetensors"),
                                         workers(n, model), name=f"{model} x{n}")
        planes |= planes_taken(procs)
        by_channel["shm"] += channel_exchanges(procs)
        print(f"      {model}, {n} Python worker(s) over shared memory: sha256 {shas[n]}", flush=True)
    checks.check(shas[1] is not None, f"{model}: the job with one Python worker finishes")
    checks.check(shas[2] == shas[1] and shas[4] == shas[1],
                 f"{model}: 1, 2 and 4 Python workers give one sha256")
    for plane, shards in (("grpc", 1), ("grpc", 2), ("shm", 2)):
        sha, procs = harness.run_job(ARGS.ps, job_flags(extra, started=2),
                                     os.path.join(d, f"{model}-{plane}-{shards}.safetensors"),
                                     workers(2, model, plane), name=f"{model} {plane} {shards} shard(s)",
                                     shards=shards)
        planes |= planes_taken(procs)
        by_channel[plane] += channel_exchanges(procs)
        print(f"      {model}, 2 Python workers over {plane} on {shards} dp-ps shard(s): sha256 {sha}",
              flush=True)
        checks.check(sha is not None and sha == shas[1],
                     f"{model}: over {plane} on {shards} dp-ps shard(s), the same sha256")
    checks.check(planes == {"shared memory", "gRPC"},
                 f"{model}: the workers said they took shared memory or gRPC as asked ({sorted(planes)})")
    # Over shared memory every exchange goes through the step channels, on
    # one shard and on two (the follower's push and pull too): no call; over
    # gRPC never.
    checks.check(len(by_channel["shm"]) == 1 + 2 + 4 + 2 and
                 all(steps == 0 or through > 0 for steps, through, _ in by_channel["shm"]) and
                 sum(through for _, through, _ in by_channel["shm"]) >= 4 * STEPS and
                 all(calls == 0 for _, _, calls in by_channel["shm"]),
                 f"{model}: every Python worker over shared memory exchanged its steps through the "
                 f"step channels, with no call ((steps, through shard 0's channel, calls): "
                 f"{by_channel['shm']})")
    checks.check(len(by_channel["grpc"]) == 4 and
                 all(through == 0 and calls >= steps for steps, through, calls in by_channel["grpc"]),
                 f"{model}: over gRPC no step went through a step channel ({by_channel['grpc']})")
    # Two ranks, so that the new worker (no --rank) is given the lost rank 1:
    # with --on_worker_loss=wait each step waits for rank 1's block, and a
    # third rank would leave it waiting for ever. A long lease: rank 0 is
    # held until the new process joined, which on a loaded machine took
    # more than the default 10 s, and rank 0, lost for its silence, went to
    # the new process. The killed one is missed at once all the same (its
    # connection closes).
    joined_at = []
    flags = ["--backup_blocks=0", "--on_worker_loss=wait", "--worker_timeout_s=600"]
    sha, _ = harness.run_job(ARGS.ps, job_flags(extra + flags, ranks=2),
                             os.path.join(d, f"{model}-killed.safetensors"),
                             killed_and_replaced(model, joined_at), name=f"{model} killed")
    checks.check(joined_at == [(1, KILL_AT)],
                 f"{model}: the new worker took the lost rank 1 at step {KILL_AT} ((rank, step): {joined_at})")
    print(f"      {model}, a worker killed at step {KILL_AT} and replaced: sha256 {sha}", flush=True)
    checks.check(sha is not None and sha == shas[1],
                 f"{model}: a worker killed mid-job and a new one give the same sha256")


def main():
    checks = harness.Checks()
    with harness.temp_dir() as d:
        extra = []
        if ARGS.model == "cnn":
            init = os.path.join(d, "cnn-init.safetensors")
            dp_ps.save_init(models.make("cnn"), init)
            extra = [f"--init_model={init}"]
        check_model(checks, d, ARGS.model, extra)
    return checks.result()


if __name__ == "__main__":
    ARGS = harness.args(["--model"])
    sys.exit(main())
