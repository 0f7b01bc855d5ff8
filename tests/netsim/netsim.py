"""scripts/netsim.sh from Python: a net that is removed however the test ends.

    with Net(script, "netsim-test", hosts=3, rate="50mbit") as net:
        net.popen(1, ["python3", ...])   # a process in host 1's namespace
        net.addr(1), net.bytes(1)
        job = run_job(net, ps_bin, worker_bin, ps_hosts=[0], worker_hosts=[1, 2],
                      ps_flags=[...], timeout=180)   # a whole dp-ps job

The name gets the PID, so parallel tests never share a net. SIGTERM and
SIGINT (ctest's timeout, Ctrl-C) raise SystemExit, so `with` removes the net.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

PORT = 5000  # each dp-ps has its host's namespace to itself
# SimpleNet 784-256-128-10: weights and biases, float32.
MODEL_BYTES = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
# netsim.sh answers at once; a deadline all the same, for a wedged `ip`.
SCRIPT_TIMEOUT_S = 60


class Checks:
    """Named checks, each printed as it is made; result() is the exit code."""

    def __init__(self):
        self.failed = []

    def check(self, ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            self.failed.append(what)

    def result(self):
        if self.failed:
            print(f"{len(self.failed)} check(s) failed", flush=True)
            return 1
        print("all checks passed", flush=True)
        return 0


def job_test_args(default_rate):
    """The command line of a job test (--netsim, --ps, --worker, --rate),
    or None, said why, when this machine cannot make the net."""
    p = argparse.ArgumentParser()
    p.add_argument("--netsim", required=True)
    p.add_argument("--ps", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--rate", default=default_rate)
    args = p.parse_args()
    try:
        require_netns()
    except Unavailable as e:
        print(f"FAIL  cannot make the simulated network: {e}", flush=True)
        return None
    return args


class Unavailable(Exception):
    """This machine cannot make the net (not root, no ip netns, no tc)."""


def require_netns():
    """Raises Unavailable, naming what is missing, unless the net can be made."""
    if os.geteuid() != 0:
        raise Unavailable("not root: network namespaces, veth and tc need root "
                          "(CI runs the tests as root)")
    for tool in ("ip", "tc"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"],
                          capture_output=True).returncode != 0:
            raise Unavailable(f"{tool} not found: install iproute2 (scripts/setup.sh)")
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        raise Unavailable(f"ip netns does not work here: {r.stderr.strip()}")


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def default_signals():
    """preexec_fn: SIGINT and SIGTERM as the defaults in the child, even
    where this process was started with them ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Net:
    def __init__(self, script, prefix, hosts, rate):
        self.script = script
        self.name = f"{prefix}-{os.getpid()}"
        self.hosts = hosts
        self.rate = rate

    def __enter__(self):
        signal.signal(signal.SIGTERM, _exit_on_signal)
        signal.signal(signal.SIGINT, _exit_on_signal)
        try:
            r = subprocess.run([self.script, "up", self.name, str(self.hosts), self.rate],
                               capture_output=True, text=True, timeout=120)
        except BaseException:  # a signal or the timeout: __exit__ will not run
            self.down()
            raise
        if r.returncode != 0:
            raise RuntimeError(f"netsim up failed ({r.returncode}): {r.stderr.strip()}")
        print(r.stdout.strip(), flush=True)
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    def down(self):
        r = subprocess.run([self.script, "down", self.name],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            print(f"netsim down failed: {r.stderr.strip()}", file=sys.stderr)

    def argv(self, host, cmd):
        return [self.script, "exec", self.name, str(host)] + list(cmd)

    def popen(self, host, cmd, **kw):
        return subprocess.Popen(self.argv(host, cmd), **kw)

    def run(self, host, cmd, timeout, **kw):
        return subprocess.run(self.argv(host, cmd), timeout=timeout, **kw)

    def addr(self, host):
        return subprocess.run([self.script, "addr", self.name, str(host)],
                              capture_output=True, text=True, check=True,
                              timeout=SCRIPT_TIMEOUT_S).stdout.strip()

    def bytes(self, host):
        """(tx, rx): bytes host's link has sent and received so far."""
        out = subprocess.run([self.script, "bytes", self.name, str(host)],
                             capture_output=True, text=True, check=True,
                             timeout=SCRIPT_TIMEOUT_S).stdout.split()
        return int(out[0]), int(out[1])


class Proc:
    """A process in one host of the net; its output collected by a thread."""

    def __init__(self, net, host, name, argv):
        self.name = name
        self.host = host
        self.lines = []
        self.last_line_at = None  # time.monotonic() of the last line
        self.eof_at = None  # ... of the end of its output: its exit
        self.eof = False
        self.cond = threading.Condition()
        self.proc = net.popen(host, argv, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.last_line_at = time.monotonic()
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.eof_at = time.monotonic()
            self.cond.notify_all()

    def quiet_before_exit(self):
        """Seconds from its last line to its exit (None: no line, or running)."""
        with self.cond:
            if self.eof_at is None or self.last_line_at is None:
                return None
            return self.eof_at - self.last_line_at

    def output(self):
        return "\n".join(self.lines)

    def has_line(self, text):
        return any(text in line for line in self.lines)

    def search(self, pattern):
        """The first match of regex `pattern` in the output, or None."""
        for line in self.lines:
            m = re.search(pattern, line)
            if m:
                return m
        return None

    def wait_for_line(self, text, timeout):
        """True once a line holds `text`; False at EOF or the deadline."""
        with self.cond:
            return self.cond.wait_for(lambda: self.has_line(text) or self.eof,
                                      timeout) and self.has_line(text)

    def wait(self, timeout):
        """The exit code, or None when the process had to be killed at the deadline."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self.reader.join(timeout=5)
        return code

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Job:
    """What run_job saw: the processes (dp-ps shards first, in shard order,
    then the workers by rank), their exit codes by name (None: killed at the
    deadline, or never waited for), whether every dp-ps listened, the
    seconds from the workers' start to the last exit, and the bytes
    (tx, rx) each host's link carried meanwhile, by host."""

    def __init__(self):
        self.ps = []
        self.workers = []
        self.codes = {}
        self.listening = False
        self.elapsed = 0.0
        self.carried = {}

    @property
    def procs(self):
        return self.ps + self.workers

    def ok(self):
        return self.listening and all(self.codes.get(p.name) == 0 for p in self.procs)

    def steps_done(self):
        """Shard 0's "done: N steps in T s, X samples/s" as (N, T, X), or None."""
        m = self.ps[0].search(r"done: (\d+) steps in ([0-9.]+) s, (\d+) samples/s")
        return (int(m.group(1)), float(m.group(2)), int(m.group(3))) if m else None


def run_job(net, ps_bin, worker_bin, ps_hosts, worker_hosts, ps_flags, timeout,
            shard0_flags=(), worker_flags=(), listen_timeout=30):
    """Runs one dp-ps job in `net`: a dp-ps in each of ps_hosts (with more
    than one, shard k in ps_hosts[k], shard 0 given every shard's address
    and shard0_flags) and dp-worker rank r (CPU backend) in worker_hosts[r].
    Every dp-ps gets ps_flags and must say it listens within
    listen_timeout s before the workers start; then all must exit within
    `timeout` s. Whatever is still running at a deadline is killed. Each
    dp-ps listens on PORT of its own host; a worker lists the shards
    starting from a different one (rank r from shard r mod S), as no worker
    may depend on their order."""
    job = Job()
    shards = len(ps_hosts)
    addrs = [f"{net.addr(h)}:{PORT}" for h in ps_hosts]
    before = {h: net.bytes(h) for h in list(ps_hosts) + list(worker_hosts)}
    start = time.monotonic()
    try:
        for k, h in enumerate(ps_hosts):
            argv = [ps_bin, "--host=0.0.0.0", f"--port={PORT}",
                    f"--workers={len(worker_hosts)}"] + list(ps_flags)
            name = "dp-ps"
            if shards > 1:
                argv += [f"--shards={shards}", f"--shard={k}"]
                name = f"dp-ps shard {k}"
                if k == 0:
                    argv.append("--shard_addresses=" + ",".join(addrs))
            if k == 0:
                argv += list(shard0_flags)
            job.ps.append(Proc(net, h, name, argv))
        listen_deadline = time.monotonic() + listen_timeout
        job.listening = all(
            p.wait_for_line("listening on", max(0.0, listen_deadline - time.monotonic()))
            for p in job.ps)
        if not job.listening:  # the codes of those that exited say why
            for p in job.ps:
                job.codes[p.name] = p.wait(0.5)
            return job
        start = time.monotonic()
        for r, h in enumerate(worker_hosts):
            order = addrs[r % shards:] + addrs[:r % shards]
            job.workers.append(Proc(net, h, f"worker {r}", [
                worker_bin, "--ps=" + ",".join(order), f"--rank={r}",
                "--backend=cpu"] + list(worker_flags)))
        # Workers first: dp-ps exits after them (shard 0 last, once it has
        # collected the other shards' weights).
        for p in job.workers + job.ps[1:] + job.ps[:1]:
            left = max(1.0, timeout - (time.monotonic() - start))
            job.codes[p.name] = p.wait(left)
        job.elapsed = time.monotonic() - start
    finally:
        for p in job.procs:
            p.stop()
    after = {h: net.bytes(h) for h in before}
    job.carried = {h: (after[h][0] - before[h][0], after[h][1] - before[h][1])
                   for h in before}
    return job


def namespaces(name):
    """The namespaces of net `name` that exist."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True,
                         text=True, check=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names
            if n == f"{name}-sw" or (n.startswith(f"{name}-h") and n[len(name) + 2:].isdigit())]


def root_links():
    """The interfaces of the root namespace, by name."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                         text=True, check=True).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


def new_net_links(before):
    """The root namespace's interfaces that were not in `before` and carry a
    name netsim.sh gives (br0, pI, eth0): a net's link that leaked out. Other
    new interfaces are not ours (a container host adds and removes its own)
    and are ignored."""
    ours = re.compile(r"^(br0|p[0-9]+|eth0)$")
    return sorted(set(n for n in root_links() if ours.match(n)) - set(before))
