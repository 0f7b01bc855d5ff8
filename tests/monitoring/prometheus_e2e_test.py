#!/usr/bin/env python3
"""End to end: a real Prometheus on loopback scrapes a real dp-ps of two
shards and two real dp-workers while they train on Fashion-MNIST, with our
recording and alert rules loaded. Asserts, through Prometheus's HTTP API:
  - samples/s (the recording rule) is > 0 for every rank during the run;
  - the loss series exists, has several scrapes and decreases;
  - no outage alert (down, missing, stalled, NaN, checkpoints failing, job
    failed) is pending or firing;
  - every rule evaluates without error;
  - every dashboard expression returns data, its series told apart by the
    panel's legend (a job panel that forgot shard="0" shows two lines of
    one name), and the per-shard panels show both shards;
and, on the daemons' own /metrics answers: `promtool check metrics` passes,
and the dashboard and the rules name only metrics the daemons export.

Rank 0 uses the fused PushPull protocol and rank 1 the plain Push, Barrier,
Pull one (a job may mix them), so every latency histogram gets samples.
The workers serve metrics on their default address, every IPv4 and IPv6
one, and Prometheus scrapes them over IPv6 ([::1], as on an IPv6-only
cluster) where the host has an IPv6 loopback.

Prometheus applies discovered targets in batches, up to 5 s apart. So that
the scrapes see training from its first steps, rank 1 is paused (SIGSTOP)
as soon as it has said where its metrics are, and resumed (SIGCONT) once
Prometheus scrapes dp-ps and rank 0: a step needs every rank's push, so the
job cannot start before.

Every wait is an event (a log line, a process exit) or a bounded poll of an
HTTP endpoint with a deadline; nothing sleeps to synchronise.

Usage: prometheus_e2e_test.py --ps BIN --worker BIN --prometheus BIN
                              --promtool BIN --source_dir DIR
"""

import argparse
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import monitoring_checks as mc

POLL_S = 0.1


class Failure(Exception):
    pass


class Process:
    """A child process whose combined output is read line by line."""

    def __init__(self, name, argv, log_dir):
        self.name = name
        self.log_path = os.path.join(log_dir, name.replace(" ", "-") + ".log")
        self.lines = queue.Queue()
        self.output = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                self.output.append(line)
                self.lines.put(line)
        self.lines.put(None)  # end of output

    def wait_for_line(self, pattern, deadline):
        """The first match of `pattern` in a line, waiting for new lines until
        the deadline; fails when the output ends first."""
        rx = re.compile(pattern)
        for line in list(self.output):
            if m := rx.search(line):
                return m
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failure(f"{self.name}: no line matching {pattern!r} in "
                              f"time\n{self.tail()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise Failure(f"{self.name} ended (exit {self.proc.wait()}) "
                              f"without a line matching {pattern!r}\n{self.tail()}")
            if m := rx.search(line):
                return m

    def tail(self, n=25):
        return "".join(f"    {l}" for l in self.output[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def ipv6_loopback():
    """Whether this host can listen on ::1 (IPv6 may be disabled)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class PrometheusApi:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path, **params):
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as e:
            body = json.loads(e.read().decode())
        if body.get("status") != "success":
            raise Failure(f"GET {url}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.get("/api/v1/query", **params)["result"]


def poll(what, deadline, probe, processes=()):
    """Calls probe() until it returns a true value or the deadline passes;
    fails early when one of `processes` exits."""
    last = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except (Failure, OSError, urllib.error.URLError) as e:
            last = e
        for p in processes:
            if p.proc.poll() is not None:
                raise Failure(f"{p.name} exited ({p.proc.returncode}) while "
                              f"waiting for {what}\n{p.tail()}")
        time.sleep(POLL_S)  # polling interval, not synchronisation
    raise Failure(f"timed out waiting for {what}" + (f" (last: {last})" if last else ""))


def write_targets(path, targets):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump([{"targets": targets}], f)
    os.replace(tmp, path)  # Prometheus never reads a half-written file


def run(args, tmp, processes):
    """Appends every process it starts to `processes` (the caller stops them)."""
    source = os.path.abspath(args.source_dir)
    rules_dir = os.path.join(source, "deploy", "prometheus", "rules")
    rule_files = sorted(os.path.join(rules_dir, n) for n in os.listdir(rules_dir))
    dashboard = mc.load_dashboard(
        os.path.join(source, "deploy", "grafana", "dashboards", "dp-ps.json"))
    start = time.monotonic()

    # 1. Prometheus, with empty target files that are filled as the daemons
    #    come up (file discovery: their ports are picked at start).
    ps_targets = os.path.join(tmp, "ps-targets.json")
    worker_targets = os.path.join(tmp, "worker-targets.json")
    write_targets(ps_targets, [])
    write_targets(worker_targets, [])
    config = {
        "global": {"scrape_interval": "250ms", "scrape_timeout": "250ms",
                   "evaluation_interval": "250ms"},
        "rule_files": rule_files,
        "scrape_configs": [
            {"job_name": "dp-ps", "file_sd_configs": [
                {"files": [ps_targets], "refresh_interval": "1s"}]},
            {"job_name": "dp-worker", "file_sd_configs": [
                {"files": [worker_targets], "refresh_interval": "1s"}]},
        ],
    }
    config_path = os.path.join(tmp, "prometheus.yml")
    with open(config_path, "w") as f:
        json.dump(config, f)  # JSON is YAML
    api = None
    for attempt in range(3):  # the free port may be taken before it binds
        port = free_port()
        prom = Process(f"prometheus-{attempt}", [
            args.prometheus, f"--config.file={config_path}",
            f"--storage.tsdb.path={os.path.join(tmp, f'data{attempt}')}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            tmp)
        processes.append(prom)
        api = PrometheusApi(port)
        try:
            poll("Prometheus to be ready", time.monotonic() + 60,
                 lambda: http_get(f"{api.base}/-/ready"), [prom])
            break
        except Failure as e:
            prom.stop()
            if attempt == 2:
                raise
            print(f"retrying Prometheus: {e}")
    print(f"[{time.monotonic() - start:5.1f}s] Prometheus ready on {api.base}")

    # 2. dp-ps as two shards and two workers, every metrics port picked by
    #    the process. Shard 1 first, on any port; shard 0 needs every
    #    shard's address, its own included, so it gets a port picked here.
    deadline = time.monotonic() + 60
    job = ["--host=127.0.0.1", "--metrics_port=-1", "--metrics_host=127.0.0.1",
           "--workers=2", "--batch_size=256", "--epochs=3", "--seed=1",
           "--dataset=fashion-mnist", "--shards=2"]
    # Each shard with its own checkpoints, written often: the checkpoint
    # alert sees a healthy store.
    def checkpoints(shard):
        return [f"--checkpoint_dir={os.path.join(tmp, f'ckpt{shard}')}",
                "--checkpoint_every=20"]
    shard1 = Process("dp-ps shard 1", [args.ps, *job, "--port=0", "--shard=1",
                                       *checkpoints(1)], tmp)
    processes.append(shard1)
    port1 = shard1.wait_for_line(r"listening on 127\.0\.0\.1:(\d+)", deadline)[1]
    for attempt in range(3):  # the free port may be taken before it binds
        port0 = free_port()
        shard0 = Process(f"dp-ps shard 0-{attempt}", [
            args.ps, *job, f"--port={port0}", "--shard=0",
            f"--shard_addresses=127.0.0.1:{port0},127.0.0.1:{port1}",
            *checkpoints(0)], tmp)
        processes.append(shard0)
        try:
            shard0.wait_for_line(r"listening on 127\.0\.0\.1:(\d+)", deadline)
            break
        except Failure as e:
            shard0.stop()
            if attempt == 2:
                raise
            print(f"retrying shard 0: {e}")
    shards = [shard0, shard1]
    ps_metrics = [int(p.wait_for_line(r"metrics on 127\.0\.0\.1:(\d+)",
                                      deadline)[1]) for p in shards]
    write_targets(ps_targets, [f"127.0.0.1:{p}" for p in ps_metrics])
    workers, worker_metrics = [], []
    for rank, protocol in [(0, "fused"), (1, "plain")]:
        w = Process(f"worker {rank}", [
            args.worker, f"--ps=127.0.0.1:{port0},127.0.0.1:{port1}",
            f"--rank={rank}",
            # auto: where the CUDA module is built, the workers load it (and
            # fall back to the CPU without a GPU) before serving metrics.
            "--backend=auto", f"--protocol={protocol}", "--metrics_port=-1"],
            tmp)
        processes.append(w)
        workers.append(w)
        print(f"[{time.monotonic() - start:5.1f}s] worker {rank} backend: " +
              w.wait_for_line(r"backend: (.*)", deadline)[1])
        worker_metrics.append(int(w.wait_for_line(
            r"metrics on 0\.0\.0\.0:(\d+)", deadline)[1]))
    workers[1].proc.send_signal(signal.SIGSTOP)  # holds the job at step 0
    worker_host = "[::1]" if ipv6_loopback() else "127.0.0.1"
    write_targets(worker_targets, [f"{worker_host}:{p}" for p in worker_metrics])
    daemons = shards + workers
    print(f"[{time.monotonic() - start:5.1f}s] dp-ps metrics :{ps_metrics[0]} "
          f":{ps_metrics[1]}, workers {worker_host}:{worker_metrics[0]} "
          f":{worker_metrics[1]}; "
          "rank 1 paused")

    def scraping():
        active = api.get("/api/v1/targets", state="active")["activeTargets"]
        health = {int(re.search(r":(\d+)/", t["scrapeUrl"])[1]): t["health"]
                  for t in active}
        return (set(health) == {*ps_metrics, *worker_metrics} and
                all(health[p] == "up" for p in ps_metrics) and
                health[worker_metrics[0]] == "up")

    poll("Prometheus to scrape both dp-ps shards and rank 0", time.monotonic() + 60,
         scraping, daemons)
    workers[1].proc.send_signal(signal.SIGCONT)
    print(f"[{time.monotonic() - start:5.1f}s] all targets discovered; "
          "rank 1 resumed")

    # 3. While training: samples/s > 0 for every rank, from the recording rule
    #    that the real Prometheus evaluates; and an epoch's test accuracy.
    deadline = time.monotonic() + 90

    def rates():
        r = api.query("rank:dp_worker_samples:rate1m")
        by_rank = {s["metric"].get("rank"): float(s["value"][1]) for s in r}
        return by_rank if set(by_rank) == {"0", "1"} and all(
            v > 0 for v in by_rank.values()) else None

    by_rank = poll("samples/s > 0 on ranks 0 and 1", deadline, rates, daemons)
    print(f"[{time.monotonic() - start:5.1f}s] samples/s by rank: "
          + ", ".join(f"{k}: {v:.0f}" for k, v in sorted(by_rank.items())))
    poll("a test accuracy after the first epoch", deadline,
         lambda: api.query('dp_test_accuracy{role="ps"}'), daemons)

    # 4. The daemons' own answers, mid-run: promtool's lint, and the names.
    families = {}
    for name, port in [("dp-ps shard 0", ps_metrics[0]),
                       ("dp-ps shard 1", ps_metrics[1]),
                       ("worker 0", worker_metrics[0]),
                       ("worker 1", worker_metrics[1])]:
        text = http_get(f"http://127.0.0.1:{port}/metrics")
        with open(os.path.join(tmp, f"{name.replace(' ', '-')}.metrics"), "w") as f:
            f.write(text)
        lint = subprocess.run([args.promtool, "check", "metrics"], input=text,
                              capture_output=True, text=True, timeout=60)
        if lint.returncode != 0 or lint.stdout.strip() or lint.stderr.strip():
            raise Failure(f"promtool check metrics on {name}'s /metrics:\n"
                          f"{lint.stdout}{lint.stderr}")
        families.update(mc.exported_families(text))
        if name.startswith("worker") and "dp_worker_backend_info{" not in text:
            raise Failure(f"{name}'s /metrics has no dp_worker_backend_info")
    print(f"[{time.monotonic() - start:5.1f}s] promtool check metrics: "
          f"both dp-ps shards and both workers clean; {len(families)} families")
    rules = mc.load_rules(rule_files)
    recorded = mc.recorded_names(rules)
    named = [(f"dashboard '{t}' {ref}", e) for t, ref, e in
             mc.dashboard_expressions(dashboard)]
    named += [(f"rule {r.get('alert', r.get('record'))}", r["expr"])
              for _, r in rules]
    for what, expr in named:
        unknown = mc.unknown_names(mc.metric_names(expr), families, recorded)
        if unknown:
            raise Failure(f"{what} names metrics nobody exports: "
                          f"{sorted(unknown)}\n  {expr}")

    # 5. No outage alert pending or firing while the job trains normally.
    #    (The straggler alert depends on this machine's load: not asserted.)
    outage = ('ALERTS{alertname=~"DpPsDown|DpWorkerDown|DpWorkersMissing|'
              'DpTooFewWorkers|DpTrainingStalled|DpLossNotFinite|'
              'DpCheckpointFailing|DpJobFailed"}')
    if alerts := api.query(outage):
        raise Failure(f"alerts during a healthy run: {alerts}")

    # 6. Every rule evaluated, without error.
    def rules_evaluated():
        groups = api.get("/api/v1/rules")["groups"]
        all_rules = [r for g in groups for r in g["rules"]]
        bad = [r for r in all_rules if r.get("health") == "err"]
        if bad:
            raise Failure("rules failing in Prometheus: " + "; ".join(
                f"{r['name']}: {r.get('lastError')}" for r in bad))
        return len(all_rules) == len(rules) and all(
            r.get("health") == "ok" for r in all_rules)

    poll("every rule to evaluate", time.monotonic() + 30, rules_evaluated)

    # 7. The job ends well.
    for p in daemons:
        try:
            code = p.proc.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise Failure(f"{p.name} did not finish in time\n{p.tail()}")
        if code != 0:
            raise Failure(f"{p.name} exited with {code}\n{p.tail()}")
    final = shard0.wait_for_line(r"final test accuracy: ([0-9.]+)", deadline)
    print(f"[{time.monotonic() - start:5.1f}s] job finished: {final[0]}")

    # 7b. How the job ended reached Prometheus before dp-ps exited: its last
    #     scrape holds the last step and the final accuracy it logged.
    def last(expr):
        r = api.query(f"last_over_time({expr}[10m])")
        return float(r[0]["value"][1]) if len(r) == 1 else None

    step = last('dp_training_step{role="ps",shard="0"}')
    planned = last('dp_training_planned_steps{role="ps",shard="0"}')
    accuracy = last('dp_test_accuracy{role="ps",shard="0"}')
    print(f"last scraped: step {step} of {planned}, accuracy {accuracy}")
    if step is None or step != planned:
        raise Failure(f"the last scraped step is {step}, not the job's last "
                      f"({planned}): dp-ps exited before a scrape of its end")
    if accuracy is None or abs(accuracy - float(final[1])) > 5e-5:
        raise Failure(f"the last scraped accuracy is {accuracy}, dp-ps "
                      f"reported {final[1]}: its final value was never scraped")

    # 8. The loss as scraped: several samples, falling.
    def loss_samples():
        r = api.query('dp_training_loss{role="ps",shard="0"}[10m]')
        return r[0]["values"] if len(r) == 1 else None

    values = poll("the loss series", time.monotonic() + 10, loss_samples)
    losses = [float(v) for _, v in values]
    print(f"[{time.monotonic() - start:5.1f}s] {len(losses)} loss samples: "
          f"first {losses[:3]}, last {losses[-3:]}")
    if len(losses) < 10:
        raise Failure(f"only {len(losses)} scrapes of the loss: {losses}")
    # Thirds, not single samples: each sample is one step's mini-batch loss.
    third = len(losses) // 3
    first = sum(losses[:third]) / third
    last = sum(losses[-third:]) / third
    print(f"mean loss of the first third {first:.3f}, last third {last:.3f}")
    if not (last < 0.85 * first and losses[-1] < losses[0]):
        raise Failure(f"the loss did not decrease: {losses}")

    # 9. Every dashboard expression returns data, evaluated at the last moment
    #    every daemon was still being scraped (later, its series are stale).
    last_scrapes = [float(s["values"][-1][0])
                    for s in api.query("dp_build_info[10m]")]
    if len(last_scrapes) != 4:
        raise Failure(f"dp_build_info of {len(last_scrapes)} targets, not 4")
    at = min(last_scrapes) - 0.001
    empty, merged = [], []
    for title, ref, expr, legend in mc.dashboard_legends(dashboard):
        result = api.query(expr, at=at)
        if not result:
            empty.append(f"'{title}' {ref}: {expr}")
            continue
        names = [mc.render_legend(legend, s["metric"]) for s in result]
        if len(set(names)) != len(names):
            merged.append(f"'{title}' {ref} ({legend!r}: {sorted(names)}): {expr}")
        if "{{shard}}" in legend and \
                {s["metric"].get("shard") for s in result} != {"0", "1"}:
            merged.append(f"'{title}' {ref} does not show shards 0 and 1: "
                          f"{[s['metric'] for s in result]}")
    if empty:
        raise Failure("dashboard expressions without data at the end of the "
                      "run:\n  " + "\n  ".join(empty))
    if merged:
        raise Failure("dashboard series a legend cannot tell apart (or "
                      "missing shards):\n  " + "\n  ".join(merged))
    print(f"[{time.monotonic() - start:5.1f}s] all "
          f"{len(mc.dashboard_expressions(dashboard))} dashboard expressions "
          "return data")


def main():
    ap = argparse.ArgumentParser()
    for flag in ["ps", "worker", "prometheus", "promtool", "source_dir"]:
        ap.add_argument(f"--{flag}", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dp-prom-e2e-")
    processes = []
    try:
        run(args, tmp, processes)
        print("OK")
        return 0
    except Failure as e:
        print(f"FAIL {e}\n(logs in {tmp})")
        args.keep = True
        return 1
    finally:
        # Only the processes this test started, by handle.
        for p in processes:
            p.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
