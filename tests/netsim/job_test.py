#!/usr/bin/env python3
"""A real job through the simulated network: dp-ps in host 0, dp-worker
rank 0 in host 1 and rank 1 in host 2 (CPU backend, synthetic data, 20
steps), each host's link shaped to --rate. Asserts that every process exits
0, that dp-ps says "done: 20 steps", and that the traffic went through the
hosts' links: each worker's link sent 20 gradients and received 20 sets of
weights (0.94 MB each in float32), dp-ps's link twice that. Prints the bytes
each host link carried.

Not root, or no `ip netns`: the test fails saying so (CI runs as root).
Every wait has a deadline.

Usage: job_test.py --netsim scripts/netsim.sh --ps BIN --worker BIN [--rate 100mbit]
"""

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netsim  # noqa: E402

PORT = 5000  # dp-ps has host 0's namespace to itself
STEPS = 20
WORKERS = 2
# SimpleNet 784-256-128-10: weights and biases, float32.
MODEL_BYTES = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
JOB_TIMEOUT_S = 180


class Proc:
    """A process in one host of the net; its output collected by a thread."""

    def __init__(self, net, host, name, argv):
        self.name = name
        self.lines = []
        self.cond = threading.Condition()
        self.proc = net.popen(host, argv, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    eof = False

    def output(self):
        return "\n".join(self.lines)

    def wait_for_line(self, text, timeout):
        """True once a line holds `text`; False at EOF or the deadline."""
        with self.cond:
            return self.cond.wait_for(
                lambda: any(text in line for line in self.lines) or self.eof, timeout) and \
                any(text in line for line in self.lines)

    def wait(self, timeout):
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--netsim", required=True)
    p.add_argument("--ps", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--rate", default="100mbit")
    args = p.parse_args()
    try:
        netsim.require_netns()
    except netsim.Unavailable as e:
        print(f"FAIL  cannot make the simulated network: {e}", flush=True)
        return 1

    failed = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            failed.append(what)

    with netsim.Net(args.netsim, "netsim-job", 1 + WORKERS, args.rate) as net:
        ps_addr = net.addr(0)
        procs = []
        try:
            ps = Proc(net, 0, "dp-ps", [
                args.ps, "--host=0.0.0.0", f"--port={PORT}", f"--workers={WORKERS}",
                "--dataset=synthetic", f"--max_steps={STEPS}", "--batch_size=16"])
            procs.append(ps)
            check(ps.wait_for_line("listening on", 30), "dp-ps listens in host 0")
            for r in range(WORKERS):
                procs.append(Proc(net, 1 + r, f"worker {r}", [
                    args.worker, f"--ps={ps_addr}:{PORT}", f"--rank={r}",
                    "--backend=cpu"]))
            start = time.monotonic()
            codes = {}
            for pr in procs[1:] + procs[:1]:
                left = max(1.0, JOB_TIMEOUT_S - (time.monotonic() - start))
                codes[pr.name] = pr.wait(left)
            elapsed = time.monotonic() - start
        finally:
            for pr in procs:
                pr.stop()
        for pr in procs:
            ok = codes.get(pr.name) == 0
            check(ok, f"{pr.name} exits 0 (got {codes.get(pr.name)})")
            if not ok:
                print(f"----- {pr.name} output -----\n{pr.output()}\n-----", flush=True)
        check(any(f"done: {STEPS} steps" in line for line in ps.lines),
              f'dp-ps says "done: {STEPS} steps"')

        carried = [net.bytes(h) for h in range(1 + WORKERS)]
        print(f"      job: {elapsed:.1f} s at {args.rate} per host link", flush=True)
        for h, (tx, rx) in enumerate(carried):
            role = "dp-ps" if h == 0 else f"worker {h - 1}"
            print(f"      link h{h} ({role}, {net.addr(h)}): sent {tx} B "
                  f"({tx / 1e6:.1f} MB), received {rx} B ({rx / 1e6:.1f} MB)", flush=True)
        per_worker = STEPS * MODEL_BYTES
        check(all(tx >= per_worker and rx >= per_worker for tx, rx in carried[1:]),
              f"each worker's link sent and received >= {STEPS} x {MODEL_BYTES} B")
        check(carried[0][0] >= WORKERS * per_worker and carried[0][1] >= WORKERS * per_worker,
              f"dp-ps's link sent and received >= {WORKERS} x {STEPS} x {MODEL_BYTES} B")

    check(netsim.namespaces(net.name) == [], "the net is gone afterwards")
    if failed:
        print(f"{len(failed)} check(s) failed", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
