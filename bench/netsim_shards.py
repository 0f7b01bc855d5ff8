#!/usr/bin/env python3
"""How dp-ps scales with shards when the network is the limit: N workers
(default 4) and S = 1, 2, 4 dp-ps shards, each process in its own host of
the simulated network (scripts/netsim.sh), every host link shaped to RATE
both ways; synthetic data, CPU backend; float32 and bf16 (gradients and
weights: --grad_encoding=bf16 --weight_encoding=bf16 on every dp-ps).

For each configuration, the median over the repeats (the configurations
take turns within each repeat, so the machine's drift hits them alike):
  samples/s  shard 0's "done: ... X samples/s while training" (first update
             to last, so start-up and the final gather are not counted);
  ms/step    N x batch / samples/s;
  speed-up   samples/s over S=1's of the same encoding, in this run;
  MB/step    bytes (sent + received, as the link's counters count them:
             frames with their headers) through each shard's link and
             through a worker's link, over the whole job / its steps (the
             joins, the first pull and the final gather add about 1%);
  floor ms   the least time per step the busiest link needs for its bytes
             at RATE, two ways:
               1-way: its busier direction alone. Links are full duplex, so
                 no step can be shorter: a hard floor;
               2-way: both directions, one after the other. A synchronous
                 step sends its gradients before its weights exist, so a
                 link's directions mostly take turns; they overlap only
                 where one transfer ends early (dp-ps has served one worker,
                 which pushes its next gradient while the others still
                 receive; one shard has all its gradients and answers while
                 the others still receive), which lets a job come in under
                 this one;
  of 2-way   2-way floor / ms/step: how close the job runs to its links.

Then the reference: S=1 float32 with the links at CPU_RATE (10gbit, in
effect unshaped), median of as many runs: the step time the 2 cores allow.

Why RATE = 200mbit: at S=1 dp-ps's link moves N x 2 x 0.94 MB = 7.5 MB
per float32 step, 150-300 ms at 200 Mbit/s, 20x the 10-15 ms per step the
whole job needs of the 2 cores (the reference, at S=1 and at S=4 alike); at
S=4 with bf16, the fewest bytes per link, the busiest link still needs
20-40 ms per step. So the network, not the CPUs, sets the pace at every S
and both encodings; at 1gbit S=4 would be CPU-bound on this machine, and a
slower rate only makes the benchmark longer.

Needs root (network namespaces). Not a test: prints numbers, asserts none.

Usage: bench/netsim_shards.py [--ps build/server/dp-ps] [--worker build/worker/dp-worker]
         [--workers 4] [--shards 1,2,4] [--rate 200mbit] [--steps 60]
         [--batch 32] [--repeats 3] [--cpu_rate 10gbit ('' skips it)]
"""

import argparse
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "netsim"))
import netsim  # noqa: E402

NETSIM = os.path.join(ROOT, "scripts", "netsim.sh")
ENCODINGS = {
    "f32": [],
    "bf16": ["--grad_encoding=bf16", "--weight_encoding=bf16"],
}
JOB_TIMEOUT_S = 300


def rate_bits(rate):
    """A tc rate (200mbit, 1gbit) in bits/s."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(bit|kbit|mbit|gbit)", rate.lower())
    if not m:
        raise SystemExit(f"bad rate '{rate}' (e.g. 200mbit, 1gbit)")
    return float(m.group(1)) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]


def one_job(net, args, shards, encoding, worker_base):
    """Runs a job; {samples_s, steps, links: {host: (tx, rx)}} or None."""
    # --epochs: enough that --max_steps ends the job (1,000 synthetic
    # samples make 7 steps an epoch at 4 x 32).
    # --final_eval_timeout_s also bounds shard 0's collection of the other
    # shards' weights: a run that fails (a shaped link dropping a job's
    # connection, say) does so in 30 s instead of 120, and is run again.
    flags = ["--dataset=synthetic", "--epochs=1000", f"--max_steps={args.steps}",
             f"--batch_size={args.batch}", "--final_eval_timeout_s=30"] + ENCODINGS[encoding]
    job = netsim.run_job(net, args.ps, args.worker, list(range(shards)),
                         [worker_base + r for r in range(args.workers)], flags,
                         JOB_TIMEOUT_S)
    done = job.steps_done()
    if not job.ok() or done is None or done[0] != args.steps:
        print(f"netsim_shards: S={shards} {encoding} failed "
              f"(exit codes {job.codes})", file=sys.stderr)
        for p in job.procs:
            print(f"--- {p.name}\n" + "\n".join(p.lines[-3:]), file=sys.stderr)
        return None
    return {"samples_s": done[2], "steps": done[0], "links": job.carried}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ps", default=os.path.join(ROOT, "build", "server", "dp-ps"))
    p.add_argument("--worker", default=os.path.join(ROOT, "build", "worker", "dp-worker"))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--shards", default="1,2,4")
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cpu_rate", default="10gbit")
    args = p.parse_args()
    shard_counts = [int(s) for s in args.shards.split(",")]
    for binary in (args.ps, args.worker):
        if not os.access(binary, os.X_OK):
            raise SystemExit(f"netsim_shards: {binary} not found: run scripts/build.sh "
                             "(or pass --ps and --worker)")
    try:
        netsim.require_netns()
    except netsim.Unavailable as e:
        raise SystemExit(f"netsim_shards: cannot make the simulated network: {e}")
    bps = rate_bits(args.rate)
    global_batch = args.workers * args.batch
    configs = [(enc, s) for enc in ENCODINGS for s in shard_counts]
    worker_base = max(shard_counts)  # shards in hosts 0..S-1, workers after them
    hosts = worker_base + args.workers
    results = {c: [] for c in configs}
    failures = []
    started = time.monotonic()

    print(f"== dp-ps shards over the simulated network: {args.workers} workers x "
          f"{args.batch}, {args.steps} steps, synthetic data, CPU backend, host links "
          f"{args.rate}, median of {args.repeats}", flush=True)
    with netsim.Net(NETSIM, "bench-shards", hosts, args.rate) as net:
        for rep in range(1, args.repeats + 1):
            for enc, shards in configs:
                r = one_job(net, args, shards, enc, worker_base)
                if r is None:  # once more, so that a rare failure leaves no gap
                    failures.append(f"run {rep} S={shards} {enc}")
                    print(f"   run {rep}: S={shards} {enc}: failed, again", flush=True)
                    r = one_job(net, args, shards, enc, worker_base)
                results[(enc, shards)].append(r)
                print(f"   run {rep}: S={shards} {enc}: "
                      + (f"{r['samples_s']} samples/s" if r else "failed"), flush=True)

    reference = []
    if args.cpu_rate:
        with netsim.Net(NETSIM, "bench-shards-cpu", 1 + args.workers, args.cpu_rate) as net:
            for rep in range(1, args.repeats + 1):
                r = one_job(net, args, 1, "f32", 1)
                reference.append(r)
                print(f"   run {rep}: S=1 f32 at {args.cpu_rate}: "
                      + (f"{r['samples_s']} samples/s" if r else "failed"), flush=True)

    def median_of(runs, f):
        values = [f(r) for r in runs if r]
        return statistics.median(values) if values else None

    def per_step(r, host, d):  # MB per step the link sent (d=0) or received (d=1)
        return r["links"][host][d] / r["steps"] / 1e6

    print()
    head = (f"{'S':>2} {'enc':>4} {'samples/s':>9} {'ms/step':>7} {'speed-up':>8}  "
            f"{'MB/step in+out: each shard link':<32} {'a worker':>8}  "
            f"{'floor ms 1-way':>14} {'2-way':>6} {'of 2-way':>8}")
    print(head)
    print("-" * len(head))
    for enc, shards in configs:
        runs = results[(enc, shards)]
        rate = median_of(runs, lambda r: r["samples_s"])
        base = median_of(results.get((enc, shard_counts[0]), []), lambda r: r["samples_s"])
        if rate is None:
            print(f"{shards:>2} {enc:>4} {'-':>9}")
            continue
        ms = global_batch / rate * 1000
        links = list(range(shards)) + [worker_base + w for w in range(args.workers)]
        # Median MB/step of each link and direction over the runs.
        mb = {(h, d): median_of(runs, lambda r, h=h, d=d: per_step(r, h, d))
              for h in links for d in (0, 1)}
        both = {h: mb[(h, 0)] + mb[(h, 1)] for h in links}
        one_way = max(max(mb[(h, 0)], mb[(h, 1)]) for h in links)
        two_way = max(both.values())
        floor1, floor2 = (x * 1e6 * 8 / bps * 1000 for x in (one_way, two_way))
        worker = statistics.mean(both[worker_base + w] for w in range(args.workers))
        speedup = f"{rate / base:.2f}x" if base else "-"
        print(f"{shards:>2} {enc:>4} {rate:>9.0f} {ms:>7.1f} {speedup:>8}  "
              f"{' '.join(f'{both[h]:.2f}' for h in range(shards)):<32} {worker:>8.2f}  "
              f"{floor1:>14.1f} {floor2:>6.1f} {floor2 / ms:>8.0%}")
    if reference:
        rate = median_of(reference, lambda r: r["samples_s"])
        if rate:
            print(f"reference, S=1 f32 with {args.cpu_rate} links (the CPUs' limit): "
                  f"{rate:.0f} samples/s, {global_batch / rate * 1000:.1f} ms/step")
    print(f"MB/step: sent + received by the link over the whole job / steps. floor ms: the "
          f"busiest link's MB/step\n  at {args.rate}: its busier direction (1-way), both "
          f"directions in turn (2-way); see the top of bench/netsim_shards.py.")
    if failures:
        print(f"failed and run again: {', '.join(failures)} (the reasons on stderr)")
    print(f"total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
