"""scripts/netsim.sh from Python: a net that is removed however the test ends.

    with Net(script, "netsim-test", hosts=3, rate="50mbit") as net:
        net.popen(1, ["python3", ...])   # a process in host 1's namespace
        net.addr(1), net.bytes(1)

The name gets the PID, so parallel tests never share a net. SIGTERM and
SIGINT (ctest's timeout, Ctrl-C) raise SystemExit, so `with` removes the net.
"""

import os
import signal
import subprocess
import sys


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
                              capture_output=True, text=True, check=True).stdout.strip()

    def bytes(self, host):
        """(tx, rx): bytes host's link has sent and received so far."""
        out = subprocess.run([self.script, "bytes", self.name, str(host)],
                             capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]), int(out[1])


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
