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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netsim  # noqa: E402

STEPS = 20
WORKERS = 2
JOB_TIMEOUT_S = 180


def main():
    args = netsim.job_test_args("100mbit")
    if args is None:
        return 1
    checks = netsim.Checks()
    check = checks.check

    with netsim.Net(args.netsim, "netsim-job", 1 + WORKERS, args.rate) as net:
        job = netsim.run_job(
            net, args.ps, args.worker, ps_hosts=[0],
            worker_hosts=list(range(1, 1 + WORKERS)),
            # No straggler backups: they hand a late block to another worker
            # as well when a link is slow, and which one (and so whose link
            # carries it) depends on timing, not on the job.
            ps_flags=["--dataset=synthetic", f"--max_steps={STEPS}", "--batch_size=16",
                      "--backup_blocks=0"],
            timeout=JOB_TIMEOUT_S)
        check(job.listening, "dp-ps listens in host 0")
        for pr in job.procs:
            ok = job.codes.get(pr.name) == 0
            check(ok, f"{pr.name} exits 0 (got {job.codes.get(pr.name)})")
            if not ok:
                print(f"----- {pr.name} output -----\n{pr.output()}\n-----", flush=True)
        ps = job.ps[0]
        check(ps.has_line(f"done: {STEPS} steps"), f'dp-ps says "done: {STEPS} steps"')

        carried = [job.carried.get(h, (0, 0)) for h in range(1 + WORKERS)]
        print(f"      job: {job.elapsed:.1f} s at {args.rate} per host link", flush=True)
        for h, (tx, rx) in enumerate(carried):
            role = "dp-ps" if h == 0 else f"worker {h - 1}"
            print(f"      link h{h} ({role}, {net.addr(h)}): sent {tx} B "
                  f"({tx / 1e6:.1f} MB), received {rx} B ({rx / 1e6:.1f} MB)", flush=True)
        per_worker = STEPS * netsim.MODEL_BYTES
        check(all(tx >= per_worker and rx >= per_worker for tx, rx in carried[1:]),
              f"each worker's link sent and received >= {STEPS} x {netsim.MODEL_BYTES} B")
        check(carried[0][0] >= WORKERS * per_worker and carried[0][1] >= WORKERS * per_worker,
              f"dp-ps's link sent and received >= {WORKERS} x {STEPS} x {netsim.MODEL_BYTES} B")

    check(netsim.namespaces(net.name) == [], "the net is gone afterwards")
    return checks.result()


if __name__ == "__main__":
    sys.exit(main())
