#!/usr/bin/env python3
"""python_features: what a Python worker takes and is refused, clearly.
A module whose tensors are the job's in another order trains the same
model (matched by name); a module with BatchNorm's buffers is refused
(save_init and Worker, naming them); a worker whose data differ from the
job's (another data_id: DataMismatch, exit 2); a worker without dp-ps's
token or with a wrong one (Unauthenticated, exit 2), while one with the
token trains; a worker whose shards part between its registration and
its pull registers again, and one that sees them apart only because the
job moved on while it asked them rolls nothing back; a version rewritten
in shared memory just before the worker reads it is pulled again, without
registering again; a step-channel wait past its deadline waits again for
the request it posted.

Usage: features_test.py --ps BIN --worker BIN --source_dir DIR
"""

import contextlib
import io
import os
import signal
import sys

import torch
import torch.nn as nn

import harness
import models
import dp_ps
from dp_ps import shards
from dp_ps._proto import dp_pb2


def buffers_refused(checks, d):
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    for what, call in (("save_init", lambda: dp_ps.save_init(model, os.path.join(d, "bn.safetensors"))),
                       ("Worker", lambda: dp_ps.Worker("127.0.0.1:1", model, (10, 0)))):
        try:
            call()
            message = None
        except ValueError as e:
            message = str(e)
        checks.check(message is not None and "1.running_mean" in message and "BatchNorm" in message,
                     f"{what} refuses BatchNorm's buffers, naming them: {message}")
    checks.check(not os.path.exists(os.path.join(d, "bn.safetensors")), "save_init wrote no file")


def bad_options_refused(checks):
    """A Worker with an option out of its range is refused before it calls
    anyone, the option named."""
    model = nn.Linear(4, 2)
    for option, value in (("spin_us", -1), ("spin_us", 10001), ("data_plane", "pcie")):
        try:
            dp_ps.Worker("127.0.0.1:1", model, (10, 0), **{option: value})
            message = None
        except dp_ps.errors.ConfigError as e:
            message = str(e)
        checks.check(message is not None and message.startswith(f"{option}: {value!r}"),
                     f"Worker({option}={value!r}) is refused, naming it: {message}")


def refused(checks, ps, flags, first, second, error):
    """A job of 2; worker `first` joins, worker `second` is refused with `error`."""
    p, address = harness.start_ps(ps, flags)
    w0 = harness.start_python_worker("first worker", address, first)
    joined = w0.wait_line(r"joined at step", timeout=120)
    checks.check(joined is not None, f"the first worker ({' '.join(first)}) joins")
    w1 = harness.start_python_worker("second worker", address, second)
    code = w1.wait(300)
    checks.check(code == 2 and f"error {error}" in w1.output(),
                 f"a worker with {' '.join(second) or 'no flags'} exits 2 with {error} (got {code}): "
                 + w1.output().splitlines()[-1] if w1.output() else "")
    for proc in (w0, p):
        proc.p.kill()
        proc.wait(60)


def any_tensor_order(checks, a, d):
    """The module's tensors are matched to the job's by name: a module
    whose state_dict lists them in another order trains the same model."""
    flags = ["--workers=1", "--max_steps=6", "--batch_size=16", "--seed=5"]
    shas, ends = {}, []
    for model in ("mlp", "mlp_last_first"):
        shas[model], procs = harness.run_job(
            a.ps, flags, os.path.join(d, f"{model}.safetensors"),
            lambda address: [harness.start_python_worker(model, address, ["--model", model, "--no_test_set"])],
            name=model)
        ends.append("no final test accuracy: rank 0 has no test set" in procs[-1].output())
    checks.check(shas["mlp"] is not None and shas["mlp"] == shas["mlp_last_first"],
                 f"a module with the job's tensors in another order trains the same model ({shas})")
    # Rank 0 without a test set reports the end, as dp-worker does, instead
    # of leaving dp-ps to wait --final_eval_timeout_s for it.
    checks.check(all(ends), f"dp-ps hears the end from rank 0 without a test set ({ends})")


@contextlib.contextmanager
def two_shard_worker(checks, a, name, data_plane="grpc", **worker_options):
    """A one-rank job on two dp-ps shards and its Python worker (over
    `data_plane`), with the shards' processes by address, or (None, None,
    None) when the shards do not start; killed afterwards."""
    procs, addresses = harness.start_shards(a.ps, ["--workers=1", "--max_steps=6", "--batch_size=16"], 2,
                                            name)
    try:
        if addresses is None:
            checks.check(False, "two dp-ps shards start")
            yield None, None, None
            return
        worker = dp_ps.Worker(",".join(addresses), models.make("mlp", "784,256,128,10"), dp_ps.IdxDataset(),
                              rank=0, data_plane=data_plane, retry_for_s=60, **worker_options)
        try:
            yield worker, addresses, procs
        finally:
            worker.close()
    finally:
        for p in procs:
            p.p.kill()
            p.wait(60)


def push_step(group, k, step):
    """Rank 0's (zero) gradient of `step` to shard k, past the worker."""
    offset, length = group.ranges[k]
    group.shard(k).call("Push", dp_pb2.PushRequest(
        rank=0, step=step, offset=offset, gradient=bytes(4 * length), loss=1.0, num_samples=16,
        block=dp_pb2.Block(first=0, count=1)))


def before_once(group, name, before):
    """The group's method `name` calls before() first, the next time only."""
    original = getattr(group, name)

    def hooked(*args):
        setattr(group, name, original)
        before()
        return original(*args)
    setattr(group, name, hooked)


def join(worker, addresses):
    """worker.join(): (its failure or None, what it printed, the shards'
    steps after it)."""
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output):
            worker.join()
        failure = None
    except dp_ps.errors.DpError as e:
        failure = e
    return failure, output.getvalue(), [harness.status(address).step for address in addresses]


def join_race(checks, a, d):
    """Shard 0 applies a step that shard 1 never saw between a worker's
    registration (both at step 0) and its pull, as when shard 1 restarted
    behind a push that shard 0 took after the restart: the pull meets the
    shards at other versions, and the worker registers again (its join
    rolls shard 0 back) instead of failing."""
    with two_shard_worker(checks, a, "join race") as (worker, addresses, _):
        if worker is None:
            return
        before_once(worker._group, "pull", lambda: push_step(worker._group, 0, 0))
        failure, out, steps = join(worker, addresses)
        checks.check(failure is None and worker.step == 0 and steps == [0, 0]
                     and "registering again" in out,
                     f"a shard that moved on between the registration and the pull makes the worker register "
                     f"again: it joined at step {worker.step} with the shards at {steps} ({failure}; "
                     f"{out.strip()})")


def join_skew(checks, a, d):
    """The job moves on two steps between a join's registration with shard 0
    and its registration with shard 1, so the two answer steps two apart:
    they were asked one after another, not found apart, and the worker
    joins at the newest version instead of rolling the shards back (to step
    0, throwing the steps away). Then the same between its pulls: shard 1
    no longer holds the version shard 0 gave, and the worker pulls again
    without registering again."""
    with two_shard_worker(checks, a, "join skew") as (worker, addresses, _):
        if worker is None:
            return
        worker.join()  # at step 0 on both: the shards' ranges are known
        group = worker._group

        def move_on_two_steps(first):
            for step in (first, first + 1):
                for k in (1, 0):  # followers first, as workers push
                    push_step(group, k, step)

        for hooked, at, what in (
                ("_register_all", 2, "shards seen two steps apart while the job moved on are joined at the "
                                     "newest version, not rolled back"),
                ("_pull_followers", 4, "a version gone from shard 1 because the job moved on after shard 0 "
                                       "gave it is pulled again, without registering again")):
            before_once(group, hooked, lambda first=at - 2: move_on_two_steps(first))
            failure, out, steps = join(worker, addresses)
            checks.check(failure is None and worker.step == at and steps == [at, at]
                         and "rolling them back" not in out and "registering again" not in out,
                         f"{what}: joined at step {worker.step} with the shards at {steps} ({failure}; "
                         f"{out.strip()})")


def shm_moved_under_read(checks, a, d):
    """The job moves on two steps just before the worker reads the version
    shard 0 gave from shared memory, so that buffer holds a newer version:
    the worker pulls again, as dp-worker does, and does not register
    again."""
    with two_shard_worker(checks, a, "shm moved", data_plane="shm") as (worker, addresses, _):
        if worker is None:
            return
        worker.join()
        group = worker._group
        checks.check(group.shard(0).plane is not None, "the worker reads shard 0's weights from shared memory")

        def move_on_two_steps():
            for step in (0, 1):
                for k in (1, 0):  # followers first, as workers push
                    push_step(group, k, step)

        # A registration maps the plane anew: hook the one the pull reads.
        before_once(group, "pull", lambda: before_once(group.shard(0).plane, "read_weights", move_on_two_steps))
        failure, out, steps = join(worker, addresses)
        checks.check(failure is None and worker.step == 2 and steps == [2, 2] and "registering again" not in out,
                     f"a shared-memory version overwritten because the job moved on is pulled again, without "
                     f"registering again: joined at step {worker.step} with the shards at {steps} ({failure}; "
                     f"{out.strip()})")


def channel_wait_past_deadline(checks, a, d):
    """A wait through the step channel that outlives wait_timeout_s waits
    again for the same request instead of posting another: shard 0 is held
    (SIGSTOP) from the post until the worker's wait has run out once, and
    let go at the retry; the step is applied once, the request posted
    once."""
    with two_shard_worker(checks, a, "channel wait", data_plane="shm",
                          wait_timeout_s=0.5) as (worker, addresses, procs):
        if worker is None:
            return
        worker.join()
        group = worker._group
        channel = group.shard(0).plane.channel
        checks.check(channel is not None, "the worker has shard 0's step channel")
        if channel is None:
            return
        leader = procs[group.order[0]].p
        posted = channel._posted
        original, tries = shards._through, []

        def held(through, kind, *args):
            # Shard 0's push-and-wait only: the follower's push and pull go
            # through its own channel.
            if through is channel:
                tries.append(channel._posted)
                leader.send_signal(signal.SIGSTOP if len(tries) == 1 else signal.SIGCONT)
            return original(through, kind, *args)
        shards._through = held
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                applied = worker.push(torch.zeros(sum(n for _, n in group.ranges)), 1.0)
        finally:
            shards._through = original
            leader.send_signal(signal.SIGCONT)
        steps = [harness.status(address).step for address in addresses]
        checks.check(applied and worker.step == 1 and steps == [1, 1] and len(tries) == 2
                     and channel._posted == posted + 1 and "still waiting at step 0" in output.getvalue()
                     and group.channel_exchanges >= 1,
                     f"a step-channel wait past its deadline waits again for its request: applied {applied}, "
                     f"the worker at step {worker.step}, the shards at {steps}, {len(tries)} waits, "
                     f"{channel._posted - posted} request(s) posted ({output.getvalue().strip()})")


def main():
    a = harness.args()
    checks = harness.Checks()
    with harness.temp_dir() as d:
        buffers_refused(checks, d)
        bad_options_refused(checks)
        any_tensor_order(checks, a, d)
        join_race(checks, a, d)
        join_skew(checks, a, d)
        shm_moved_under_read(checks, a, d)
        channel_wait_past_deadline(checks, a, d)
        job = ["--workers=2", "--max_steps=100000", "--batch_size=16"]
        refused(checks, a.ps, job, ["--data_id", "set-a"], ["--data_id", "set-b"], "DataMismatch")
        token = os.path.join(d, "token")
        with open(token, "w") as f:
            f.write("s3cret-token-of-the-job\n")
        secured = job + [f"--auth_token_file={token}"]
        refused(checks, a.ps, secured, ["--token", "s3cret-token-of-the-job"], ["--token", "wrong"],
                "Unauthenticated")
        refused(checks, a.ps, secured, ["--token", "s3cret-token-of-the-job"], [], "Unauthenticated")
    return checks.result()


if __name__ == "__main__":
    sys.exit(main())
