#!/usr/bin/env python3
"""A sharded job through the simulated network against the same job on one
dp-ps: 2 workers (CPU backend, synthetic data, 30 steps of batch 32), each
process in its own host, each host's link shaped to --rate.

  1. one dp-ps in host 0, workers in hosts 2 and 3;
  2. two shards in hosts 0 and 1, workers in hosts 2 and 3 (each worker
     lists the shards in a different order).

Asserts that every process exits 0 (every dp-ps within 6 s of its last
line), that shard 0 (and the lone dp-ps) says
"done: 30 steps", that the models the two jobs saved (--save_model on
shard 0) are byte-identical, and, from the links' byte counters, that the
shards split dp-ps's traffic: each shard's link carried 40-60% of what
the two shard links carried together, in each direction, and together
85-115% of what the lone dp-ps's link carried (shard 0 also gathers shard
1's weights at the end: 0.47 MB, under 1%). Prints the bytes of every link.

dp-ps offers shared memory by default; the workers, in other namespaces,
cannot reach it and use gRPC, so every tensor crosses the links.

Not root, or no `ip netns`: the test fails saying so (CI runs as root).
Every wait has a deadline, and the net is removed however the test ends.

Usage: shards_test.py --netsim scripts/netsim.sh --ps BIN --worker BIN [--rate 200mbit]
"""

import filecmp
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netsim  # noqa: E402

STEPS = 30
WORKERS = 2
SHARDS = 2
WORKER_HOSTS = [2, 3]  # the same in both jobs
JOB_TIMEOUT_S = 180
EXIT_WITHIN_S = 6


def main():
    args = netsim.job_test_args("200mbit")
    if args is None:
        return 1
    checks = netsim.Checks()
    check = checks.check

    # --final_eval_timeout_s also bounds shard 0's collection of the other
    # shards' weights: a shard that is gone before shard 0 has its part
    # fails the job in 30 s rather than 120. No straggler backups: a backed
    # up block crosses the links twice, as often as the links' timing says,
    # and the byte counts below are the job's.
    flags = ["--dataset=synthetic", f"--max_steps={STEPS}", "--batch_size=32", "--seed=7",
             "--final_eval_timeout_s=30", "--backup_blocks=0"]
    with tempfile.TemporaryDirectory(prefix="netsim-shards-") as tmp, \
            netsim.Net(args.netsim, "netsim-shards", SHARDS + WORKERS, args.rate) as net:
        jobs = {}
        for label, ps_hosts in (("1 dp-ps", [0]), (f"{SHARDS} shards", list(range(SHARDS)))):
            model = os.path.join(tmp, f"{len(ps_hosts)}.safetensors")
            job = netsim.run_job(net, args.ps, args.worker, ps_hosts, WORKER_HOSTS, flags,
                                 JOB_TIMEOUT_S, shard0_flags=[f"--save_model={model}"])
            jobs[label] = (job, model)
            check(job.listening, f"{label}: every dp-ps listens")
            for pr in job.procs:
                ok = job.codes.get(pr.name) == 0
                check(ok, f"{label}: {pr.name} (host {pr.host}) exits 0 "
                      f"(got {job.codes.get(pr.name)})")
                if not ok:
                    print(f"----- {pr.name} output -----\n{pr.output()}\n-----", flush=True)
            # A process whose links had filled once took 10 s to exit after
            # its last word (gRPC's shutdown joining a backup poller); an
            # exit takes well under a second, the servers' grace is 2 s.
            for pr in job.ps:
                quiet = pr.quiet_before_exit()
                check(quiet is not None and quiet < EXIT_WITHIN_S,
                      f"{label}: {pr.name} exits within {EXIT_WITHIN_S} s of its last line "
                      f"({'-' if quiet is None else f'{quiet:.2f} s'})")
            done = job.steps_done() if job.ps else None
            check(done is not None and done[0] == STEPS,
                  f'{label}: {job.ps[0].name if job.ps else "dp-ps"} says "done: {STEPS} steps"')
            print(f"      {label}: job {job.elapsed:.1f} s at {args.rate} per host link"
                  + (f", {done[2]} samples/s while training" if done else ""), flush=True)
            for h in sorted(job.carried):
                tx, rx = job.carried[h]
                role = next((pr.name for pr in job.procs if pr.host == h), "?")
                print(f"      link h{h} ({role}): sent {tx / 1e6:.2f} MB, "
                      f"received {rx / 1e6:.2f} MB", flush=True)

        (one, one_model), (sharded, sharded_model) = jobs.values()
        same = (os.path.exists(one_model) and os.path.exists(sharded_model)
                and filecmp.cmp(one_model, sharded_model, shallow=False))
        check(same, f"the model of {SHARDS} shards is byte-identical to one dp-ps's "
              f"({os.path.getsize(one_model) if os.path.exists(one_model) else '-'} B)")

        # The split: each shard's share of the shard links, per direction.
        lone = one.carried.get(0, (0, 0))
        shard_links = [sharded.carried.get(h, (0, 0)) for h in range(SHARDS)]
        for d, what in ((0, "sent"), (1, "received")):
            total = sum(link[d] for link in shard_links)
            shares = [link[d] / total if total else 0.0 for link in shard_links]
            print(f"      {what}: lone dp-ps {lone[d] / 1e6:.2f} MB; shards "
                  + " + ".join(f"{link[d] / 1e6:.2f}" for link in shard_links)
                  + f" = {total / 1e6:.2f} MB ("
                  + " / ".join(f"{s:.1%}" for s in shares) + ")", flush=True)
            check(all(0.4 <= s <= 0.6 for s in shares),
                  f"each shard's link {what} 40-60% of the shards' bytes")
            check(lone[d] > 0 and 0.85 <= total / lone[d] <= 1.15,
                  f"the shards' links together {what} 85-115% of the lone dp-ps's "
                  f"({total / lone[d]:.1%})" if lone[d] else
                  f"the lone dp-ps's link {what} bytes")
        # The lower bound the job must have moved: every step, each worker's
        # gradient in and its weights out, split over the shards.
        floor = WORKERS * STEPS * netsim.MODEL_BYTES
        check(all(tx >= floor / SHARDS * 0.9 and rx >= floor / SHARDS * 0.9
                  for tx, rx in shard_links),
              f"each shard's link sent and received >= 90% of half of "
              f"{WORKERS} x {STEPS} x {netsim.MODEL_BYTES} B")

    check(netsim.namespaces(net.name) == [], "the net is gone afterwards")
    return checks.result()


if __name__ == "__main__":
    sys.exit(main())
