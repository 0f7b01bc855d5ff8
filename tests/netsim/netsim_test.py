#!/usr/bin/env python3
"""scripts/netsim.sh does what it says, on a 3-host net at a low rate:
  - nothing is added to the root namespace, and a host routes only its subnet;
  - h0 reaches h1 over TCP, and h1 reaches h0;
  - h0's 127.0.0.1 is its own: a root-namespace listener there is not reached;
  - a bounded transfer h0 -> h2 runs at 70-105% of the set rate (TCP payload;
    the shaper counts headers too, so the ideal is about 95%);
  - the byte counters of h0's and h2's links moved by the transfer, h1's not;
  - `down` stops the processes left in the net and leaves no namespace or
    link behind;
  - a caller holding `trap down EXIT` and killed with SIGINT or SIGTERM
    leaves nothing behind, and neither does `up` interrupted midway.

Not root, or no `ip netns`: the test fails saying so (CI runs as root).
Every wait has a deadline; nothing sleeps to synchronise.

Usage: netsim_test.py --netsim scripts/netsim.sh [--rate 50mbit] [--seconds 2.5]
"""

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netsim  # noqa: E402

TRANSFER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "transfer.py")
PORT = 5201


def read_line(proc, timeout):
    """The next stdout line of proc, or '' at the deadline or EOF."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else ""


def transfer(net, src, dst, nbytes, timeout):
    """Sends nbytes from host src to host dst; the receiver's JSON, or None."""
    recv = net.popen(dst, [sys.executable, TRANSFER, "recv", "--bind", net.addr(dst),
                           "--port", str(PORT), "--bytes", str(nbytes),
                           "--timeout", str(timeout)],
                     stdout=subprocess.PIPE, text=True)
    try:
        if read_line(recv, 10) != "listening":
            return None
        send = net.run(src, [sys.executable, TRANSFER, "send", "--to", net.addr(dst),
                             "--port", str(PORT), "--bytes", str(nbytes),
                             "--timeout", str(timeout)], timeout=timeout + 10)
        line = read_line(recv, timeout + 10)
        recv.wait(timeout=10)
        if send.returncode != 0 or recv.returncode != 0 or not line:
            return None
        return json.loads(line)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def rate_bits(rate):
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1}
    for u, f in units.items():
        if rate.lower().endswith(u):
            return float(rate[: -len(u)]) * f
    raise ValueError(rate)


def check_no_leak(c, links_before, what):
    leaked = netsim.new_net_links(links_before)
    c.check(not leaked, what + (f": {leaked}" if leaked else ""))


def check_net(args, c, links_before):
    with netsim.Net(args.netsim, "netsim-test", 3, args.rate) as net:
        c.check(sorted(netsim.namespaces(net.name)) ==
                sorted([f"{net.name}-sw"] + [f"{net.name}-h{i}" for i in range(3)]),
                "up makes the switch namespace and one namespace per host")
        check_no_leak(c, links_before, "up adds no interface to the root namespace")
        routes = net.run(0, ["ip", "-4", "route", "show"], timeout=10,
                         capture_output=True, text=True).stdout.splitlines()
        c.check(len(routes) == 1 and routes[0].startswith("10.77.0.0/24 "),
                f"h0 routes only its subnet: {routes}")
        c.check([net.addr(i) for i in range(3)] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"],
                "addr gives 10.77.0.(i+1)")

        r = transfer(net, 0, 1, 100_000, 20)
        c.check(r is not None and r["bytes"] == 100_000, "h0 reaches h1 over TCP")
        r = transfer(net, 1, 0, 100_000, 20)
        c.check(r is not None and r["bytes"] == 100_000, "h1 reaches h0 over TCP")

        with socket.socket() as root_listener:  # in the root namespace
            root_listener.bind(("127.0.0.1", 0))
            root_listener.listen(1)
            port = root_listener.getsockname()[1]
            probe = net.run(0, [sys.executable, "-c",
                                "import socket,sys\n"
                                "try: socket.create_connection(('127.0.0.1', %d), timeout=3)\n"
                                "except ConnectionRefusedError: sys.exit(0)\n"
                                "sys.exit(1)" % port], timeout=20)
            c.check(probe.returncode == 0,
                    "h0's 127.0.0.1 does not reach a root-namespace listener")

        set_bps = rate_bits(args.rate)
        nbytes = int(set_bps / 8 * args.seconds)
        before = [net.bytes(i) for i in range(3)]
        r = transfer(net, 0, 2, nbytes, args.seconds * 4 + 10)
        after = [net.bytes(i) for i in range(3)]
        if r is None:
            c.check(False, f"a {nbytes}-byte transfer h0 -> h2 completes")
        else:
            got = r["mbit_s"] * 1e6
            print(f"      h0 -> h2: {r['bytes']} bytes in {r['seconds']} s = "
                  f"{r['mbit_s']} Mbit/s of {set_bps / 1e6:g} Mbit/s set "
                  f"({got / set_bps:.0%})", flush=True)
            c.check(0.70 * set_bps <= got <= 1.05 * set_bps,
                    "the transfer runs at 70-105% of the set rate")
        d = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before)]
        print(f"      link bytes moved (tx, rx): h0 {d[0]}, h1 {d[1]}, h2 {d[2]}", flush=True)
        c.check(d[0][0] >= nbytes and d[2][1] >= nbytes,
                "h0's link sent and h2's link received at least the bytes moved")
        c.check(d[1][0] < nbytes // 10 and d[1][1] < nbytes // 10,
                "h1's link carried next to nothing of it")

        # A process left in the net: `down` must stop it, or the namespace
        # (and its links) would outlive `ip netns del`. It says when it runs
        # in the namespace, so that `down` cannot come first (the process
        # would then fail to enter and exit by itself); stopped by `down`,
        # it dies of a signal (netsim.sh exec execs into it).
        stray = net.popen(1, ["sh", "-c", "echo in; exec sleep 60"],
                          stdout=subprocess.PIPE, text=True)
        entered = read_line(stray, 30) == "in"
        net.down()
        try:
            stray.wait(timeout=15)
        except subprocess.TimeoutExpired:
            stray.kill()
            stray.wait()
        c.check(entered and stray.returncode in (-signal.SIGTERM, -signal.SIGKILL),
                f"down stops the processes left in the net (entered {entered}, "
                f"exit {stray.returncode})")
        c.check(netsim.namespaces(net.name) == [], "down leaves no namespace")
        check_no_leak(c, links_before, "down leaves no link")
        r = subprocess.run([args.netsim, "down", net.name], capture_output=True)
        c.check(r.returncode == 0, "down again is a no-op")


def wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.001)
    return pred()


def check_interrupted_caller(args, c, sig):
    """A shell holding the documented traps, signalled while the net is up."""
    name = f"netsim-trap{sig}-{os.getpid()}"
    script = ('trap "$0 down %s" EXIT; trap "exit 130" INT TERM; '
              '"$0" up %s 2 %s >/dev/null || exit 1; echo up; read -t 60 _' % (name, name, args.rate))
    proc = subprocess.Popen(["bash", "-c", script, args.netsim], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            preexec_fn=netsim.default_signals)
    left = None
    try:
        came_up = read_line(proc, 60).endswith("up") and len(netsim.namespaces(name)) == 3
        proc.send_signal(sig)
        proc.wait(timeout=60)
        # What the caller's own trap left, before the cleanup below.
        left = netsim.namespaces(name)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run([args.netsim, "down", name], capture_output=True)
    signame = signal.Signals(sig).name
    c.check(came_up and proc.returncode == 130 and left == [],
            f"a caller with `trap down EXIT` killed by {signame} leaves nothing "
            f"(came up {came_up}, exit {proc.returncode}, left {left})")


def check_interrupted_up(args, c, sig):
    """`up` itself, signalled while it is building a net."""
    name = f"netsim-upint{sig}-{os.getpid()}"
    hosts = 100  # long enough to be caught midway
    proc = subprocess.Popen([args.netsim, "up", name, str(hosts), args.rate],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=netsim.default_signals)
    try:
        midway = wait_for(lambda: os.path.exists(f"/run/netns/{name}-h1"), 30)
        proc.send_signal(sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = netsim.namespaces(name)
        subprocess.run([args.netsim, "down", name], capture_output=True)
    signame = signal.Signals(sig).name
    c.check(midway and proc.returncode == 130 and left == [],
            f"up interrupted midway by {signame} removes what it made "
            f"(exit {proc.returncode}, {len(left)} namespaces left)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--netsim", required=True)
    p.add_argument("--rate", default="50mbit")
    p.add_argument("--seconds", type=float, default=2.5)
    args = p.parse_args()
    try:
        netsim.require_netns()
    except netsim.Unavailable as e:
        print(f"FAIL  cannot make the simulated network: {e}", flush=True)
        return 1
    c = netsim.Checks()
    links_before = netsim.root_links()
    check_net(args, c, links_before)
    for sig in (signal.SIGINT, signal.SIGTERM):
        check_interrupted_caller(args, c, sig)
        check_interrupted_up(args, c, sig)
    check_no_leak(c, links_before, "no link of the nets is left in the root namespace")
    return c.result()


if __name__ == "__main__":
    sys.exit(main())
