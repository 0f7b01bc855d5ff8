#!/usr/bin/env python3
"""python_operations: a Python worker as an operator runs dp-worker. Over
mTLS (tests/make_test_certs.sh's certificates) it trains to the job's end,
and one without a client certificate is refused (PsUnreachable, exit 4, as
dp-worker's TLS mismatch); its metrics endpoint serves dp-worker's names
with its rank, counting the steps it finished, in a form `promtool check
metrics` accepts; SIGTERM stops it after its step with Stopped (exit 3)
dp-ps learns at once that it is gone, and another process takes its rank
without standing by. dp-ps killed with SIGKILL mid-job and started again
from its checkpoint: the workers ride it out and the model is the bytes of
the job nothing stopped.

Usage: operations_test.py --ps BIN --worker BIN --source_dir DIR --promtool BIN
"""

import os
import re
import signal
import subprocess
import sys
import urllib.request

import harness

# The job dp-ps is killed in, and the step it is killed at (or after).
KILL_STEPS, KILL_AT = 40, 12  # checkpoints every 7 steps

# dp-worker's names the dashboard reads of a worker (deploy/k8s/monitoring).
WORKER_SERIES = ("dp_worker_step_duration_seconds_count", "dp_worker_compute_duration_seconds_count",
                 "dp_worker_push_pull_duration_seconds_count", "dp_worker_samples_total",
                 "dp_training_loss", "dp_worker_backend_info")


def over_mtls(checks, a, d):
    certs = os.path.join(d, "certs")
    subprocess.run([os.path.join(a.source_dir, "tests", "make_test_certs.sh"), certs], check=True)
    c = lambda name: os.path.join(certs, name)
    flags = ["--workers=1", "--max_steps=6", "--batch_size=16", f"--tls_cert={c('server.pem')}",
             f"--tls_key={c('server.key')}", f"--tls_ca={c('ca.pem')}"]
    ps, address = harness.start_ps(a.ps, flags, name="dp-ps over mTLS")
    address = address.replace("127.0.0.1", "localhost")  # the certificate's name
    no_cert = harness.start_python_worker("worker without a certificate", address,
                                          ["--tls_ca", c("ca.pem"), "--retry_for_s", "3"])
    code = no_cert.wait(120)
    checks.check(code == 4 and "error PsUnreachable" in no_cert.output(),
                 f"a worker without a client certificate is refused: exit 4, PsUnreachable (got {code})")
    worker = harness.start_python_worker("worker over mTLS", address,
                                         ["--tls_ca", c("ca.pem"), "--tls_cert", c("client.pem"),
                                          "--tls_key", c("client.key")])
    code = worker.wait(300)
    checks.check(code == 0 and '"step": 6' in worker.output(),
                 f"a worker with the job's client certificate trains to the end over mTLS (exit {code})")
    checks.check(ps.wait(120) == 0, "dp-ps over mTLS ends the job")
    for proc in (no_cert, worker, ps):
        if proc.p.returncode not in (0, 4):
            proc.show()


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def value(text, name, labels):
    m = re.search(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M)
    if m is None or any(f'{k}="{v}"' not in m.group(1) for k, v in labels.items()):
        return None
    return float(m.group(2))


def metrics_and_stop(checks, a, d):
    # A long lease: worker 1 is held (SIGSTOP) for as long as the scrape
    # takes, and must not be lost for its silence meanwhile.
    flags = ["--workers=2", "--max_steps=100000", "--batch_size=16", "--on_worker_loss=wait",
             "--backup_blocks=0", "--worker_timeout_s=600"]
    ps, address = harness.start_ps(a.ps, flags, name="dp-ps")
    w0 = harness.start_python_worker("worker 0", address, ["--rank", "0", "--metrics_port", "-1"])
    w1 = harness.start_python_worker("worker 1", address, ["--rank", "1", "--no_test_set"])
    port = w0.wait_line(r"metrics on port (\d+)", timeout=120)
    reached = harness.wait_until(address, lambda s: s.step >= 5, what="step 5")
    # Worker 1 held: the step waits for it (no backups, --on_worker_loss=
    # wait), and once worker 0 has pushed for it, worker 0 has finished
    # every step before it and no other: its metrics are known and still.
    w1.p.send_signal(signal.SIGSTOP)
    held = harness.wait_until(address, lambda s: 0 in s.pushed_ranks, what="worker 0's push")
    step = harness.status(address).step
    text = scrape(port.group(1)) if port and reached and held else ""
    w1.p.send_signal(signal.SIGCONT)
    labels = {"role": "worker", "rank": "0"}
    missing = [n for n in WORKER_SERIES if value(text, n, labels) is None]
    checks.check(port is not None and not missing,
                 f"worker 0 serves dp-worker's series with role and rank (missing: {missing})")
    steps = value(text, "dp_worker_step_duration_seconds_count", labels) or 0
    samples = value(text, "dp_worker_samples_total", labels) or 0
    checks.check(steps == step and samples == 16 * steps,
                 f"it counts the job's {step} steps ({steps}) and 16 samples a step ({samples})")
    path = os.path.join(d, "worker.prom")
    with open(path, "w") as f:
        f.write(text)
    lint = subprocess.run([a.promtool, "check", "metrics"], stdin=open(path), capture_output=True, text=True)
    checks.check(lint.returncode == 0 and text, f"promtool check metrics accepts it: {lint.stdout}{lint.stderr}")

    w1.p.send_signal(signal.SIGTERM)
    code = w1.wait(120)
    checks.check(code == 3 and re.search(r"error Stopped: rank 1: stopped by SIGTERM at step \d+",
                                         w1.output()) is not None,
                 f"SIGTERM stops worker 1 with Stopped, exit 3 (got {code})")
    checks.check(ps.wait_line(r"rank 1 is missing: its connection closed", timeout=120) is not None,
                 "dp-ps learns at once that rank 1 is gone (its attendance ended)")
    w2 = harness.start_python_worker("worker 1 again", address, ["--rank", "1", "--no_test_set"])
    joined = w2.wait_line(r"rank 1: joined at step", timeout=120)
    checks.check(joined is not None and "standing by" not in w2.output(),
                 "a new process takes rank 1 without standing by")
    for proc in (w0, w2, ps):
        proc.p.kill()
        proc.wait(60)
    if checks.failed:
        for proc in (w0, w1, w2, ps):
            proc.show()


def ps_killed(checks, a, d):
    """dp-ps killed (SIGKILL) mid-job and started again on its port from
    its checkpoint: the Python workers ride it out (retry, register again,
    take the new dp-ps's shared memory) and the model is the bytes of the
    job that nothing stopped."""
    def flags(name):
        return ["--workers=2", "--min_workers=2", "--batch_size=16", f"--max_steps={KILL_STEPS}", "--seed=3",
                "--backup_blocks=0", "--on_worker_loss=wait",
                f"--checkpoint_dir={os.path.join(d, name)}", "--checkpoint_every=7"]
    def plain(address, pause=()):
        return [harness.start_python_worker(f"worker {r}", address,
                                            ["--data_plane", "shm", "--rank", str(r)] + list(pause if r == 0 else ()))
                for r in range(2)]
    reference, _ = harness.run_job(a.ps, flags("reference"), os.path.join(d, "reference.safetensors"),
                                   plain, name="dp-ps, not killed")
    model = os.path.join(d, "killed.safetensors")
    first, address = harness.start_ps(a.ps, flags("killed") + [f"--save_model={model}"], name="dp-ps")
    # Rank 0 holds itself before its push of step KILL_AT, which waits for
    # it (no backups); rank 1 is held too once its push is in. dp-ps dies
    # there, and the workers meet the new dp-ps behind them (it resumes
    # from an older checkpoint).
    workers = plain(address, ["--pause_at_step", str(KILL_AT)])
    workers[0].wait_line(rf"pausing before the push of step {KILL_AT}", timeout=120)
    reached = harness.wait_until(address, lambda s: s.step == KILL_AT and 1 in s.pushed_ranks,
                                 what=f"rank 1's push of step {KILL_AT}")
    workers[1].p.send_signal(signal.SIGSTOP)
    killed_at = harness.status(address).step if reached else None
    first.p.send_signal(signal.SIGKILL)
    first.wait(60)
    for w in workers:
        w.p.send_signal(signal.SIGCONT)
    port = address.rsplit(":", 1)[1]
    second = harness.Proc("dp-ps again", [a.ps, "--host=127.0.0.1", f"--port={port}"] + flags("killed")
                          + [f"--save_model={model}"])
    resumed = second.wait_line(r"resum\w* .*step (\d+)", timeout=60)
    codes = [w.wait(300) for w in workers] + [second.wait(120)]
    rejoined = all(w.wait_line(r"re-joining at step", timeout=1) for w in workers)
    sha = harness.sha256(model) if os.path.exists(model) else None
    checks.check(reached and resumed is not None and int(resumed.group(1)) < killed_at and codes == [0, 0, 0],
                 f"the job ends after dp-ps was killed at step {killed_at} and resumed from its checkpoint "
                 f"({resumed.group(0) if resumed else 'no resume logged'}; exits {codes})")
    checks.check(rejoined, "both workers registered again with the new dp-ps")
    checks.check(sha is not None and sha == reference,
                 f"the model is the bytes of the job nothing stopped ({sha} vs {reference})")
    if checks.failed:
        for proc in workers + [first, second]:
            proc.show()


def main():
    a = harness.args(["--promtool"])
    checks = harness.Checks()
    with harness.temp_dir() as d:
        over_mtls(checks, a, d)
        metrics_and_stop(checks, a, d)
        ps_killed(checks, a, d)
    return checks.result()


if __name__ == "__main__":
    sys.exit(main())
