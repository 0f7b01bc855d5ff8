"""What the Python worker's tests share: their command line, named checks,
real dp-ps and worker processes (each output kept, every wait with a
deadline, waits on events: a log line, an exit), and the model's sha256."""

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_SCRIPT = os.path.join(HERE, "job_worker.py")


class Checks:
    """Named checks, each printed as it is made; result() is the exit code."""

    def __init__(self):
        self.failed = []

    def check(self, ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            self.failed.append(what)
        return ok

    def result(self):
        if self.failed:
            print(f"{len(self.failed)} check(s) failed", flush=True)
            return 1
        print("all checks passed", flush=True)
        return 0


def args(extra=()):
    """--ps, --worker, --source_dir and the test's own flags."""
    p = argparse.ArgumentParser()
    p.add_argument("--ps", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--source_dir", required=True)
    for flag in extra:
        p.add_argument(flag, required=True)
    return p.parse_args()


class Proc:
    """A process whose output lines are collected as they come."""

    def __init__(self, name, argv, env=None):
        self.name = name
        self.lines = []
        self._cond = threading.Condition()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_line(self, pattern, timeout=60):
        """The first match of `pattern` in the output; None by the deadline or exit."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    m = regex.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and self.p.stdout.closed):
                    return None
                self._cond.wait(min(left, 0.5))

    def wait(self, timeout=300):
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None

    def output(self):
        with self._cond:
            return "\n".join(self.lines)

    def show(self):
        print(f"----- {self.name} output -----\n{self.output()}\n-----", flush=True)


def start_ps(binary, flags, name="dp-ps"):
    """dp-ps on a free port: (Proc, "127.0.0.1:port"); None address if it
    never listened."""
    ps = Proc(name, [binary, "--host=127.0.0.1", "--port=0"] + flags)
    m = ps.wait_line(r"listening on [^:]+:(\d+)", timeout=60)
    if m is None:
        ps.show()
        return ps, None
    return ps, f"127.0.0.1:{m.group(1)}"


def python_env():
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(HERE, "..", "..", "python"))
    return env


def start_python_worker(name, address, flags=()):
    """tests/python/job_worker.py (dp_ps.train on Fashion-MNIST) against `address`."""
    return Proc(name, [sys.executable, WORKER_SCRIPT, "--ps", address] + list(flags), env=python_env())


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def temp_dir():
    return tempfile.TemporaryDirectory(prefix="dp-python-test-")


def finish(checks, procs, timeout=300):
    """Waits for every process; each must exit 0 (its output shown if not)."""
    for pr in procs:
        code = pr.wait(timeout)
        if not checks.check(code == 0, f"{pr.name} exits 0 (got {code})"):
            pr.show()


def status(address, token=None):
    """dp-ps's GetStatusResponse."""
    import grpc
    from dp_ps._proto import dp_pb2, dp_pb2_grpc
    with grpc.insecure_channel(address) as channel:
        metadata = (("authorization", "Bearer " + token),) if token else ()
        return dp_pb2_grpc.ParameterServerStub(channel).GetStatus(
            dp_pb2.GetStatusRequest(), timeout=10, metadata=metadata)


def wait_until(address, ready, timeout=120, what="the job"):
    """Polls GetStatus until ready(status) (the event: a step, a rank
    registered); False by the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready(status(address)):
                return True
        except Exception:  # dp-ps gone or not yet up: the deadline decides
            pass
        time.sleep(0.05)
    print(f"      {what}: not reached in {timeout} s", flush=True)
    return False


def start_shards(binary, flags, count, name):
    """`count` dp-ps shards of one job, the last first, so that shard 0 can
    be told the others' addresses (it collects the model at the end):
    (Procs, addresses; None if one never listened)."""
    procs, addresses = [None] * count, [None] * count
    for k in reversed(range(count)):
        shard_flags = [f"--shards={count}", f"--shard={k}"] if count > 1 else []
        if k == 0 and count > 1:
            shard_flags.append("--shard_addresses=" + ",".join(addresses[1:]))
        procs[k], addresses[k] = start_ps(binary, flags + shard_flags, name=f"{name} shard {k}")
        if addresses[k] is None:
            return [p for p in procs if p], None
    return procs, addresses


def run_job(ps_binary, ps_flags, model_path, workers, name="job", shards=1, timeout=300):
    """dp-ps (`shards` of them) with --save_model=model_path and `workers` (a
    function of the comma-separated addresses returning the started Procs);
    the sha256 of the model (None if any process failed) and the processes.
    One deadline for the whole job, so that a job that hangs is killed and
    shown well before the test's own deadline."""
    ps, addresses = start_shards(ps_binary, ps_flags + [f"--save_model={model_path}"], shards, name)
    if addresses is None:
        for p in ps:
            p.p.kill()
        return None, ps
    procs = workers(",".join(addresses))
    deadline = time.monotonic() + timeout
    codes = [pr.wait(max(1.0, deadline - time.monotonic())) for pr in procs + ps]
    for pr, code in zip(procs + ps, codes):
        if code != 0:
            print(f"      {pr.name} exited {code}", flush=True)
            pr.show()
    if any(c != 0 for c in codes):
        # What the others saw meanwhile (dp-ps's log most of all).
        for pr, code in zip(procs + ps, codes):
            if code == 0:
                pr.show()
    if any(c != 0 for c in codes) or not os.path.exists(model_path):
        return None, procs + ps
    return sha256(model_path), procs + ps
