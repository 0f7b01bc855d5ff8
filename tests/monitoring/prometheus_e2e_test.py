#!/usr/bin/env python3
"""End to end: a real Prometheus on loopback scrapes a real dp-ps of two
shards and two real dp-workers while they train on Fashion-MNIST, with our
recording and alert rules loaded. Asserts, through Prometheus's HTTP API:
  - samples/s (the recording rule) was > 0 for every rank during the run;
  - the loss series exists, has several scrapes and decreases;
  - no outage alert (down, missing, stalled, NaN, checkpoints failing, job
    failed) fired during the run;
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

The job is paced by what Prometheus has seen, not by the clock: how many
scrapes fall into a job of 351 steps depends on the machine (4 s of
training on a quiet one gave 8). So the test holds the job HOLDS times,
evenly over its steps: it stops a worker (SIGSTOP) and resumes it
(SIGCONT) once Prometheus has scraped every other target after the stop.
A step needs every rank's block, and dp-ps runs with --backup_blocks=0 and
--on_worker_loss=wait, so a held worker holds the step: every hold is a
scrape of a distinct step, and the daemons are known alive, which is when
the test reads their /metrics itself. The held rank alternates, so both
workers are scraped during the job. At the start, rank 1 is held until
Prometheus has discovered the targets (it applies them in batches, up to
5 s apart) and scrapes dp-ps and rank 0; --start_wait_s keeps the first
step waiting for rank 1 however long that takes.

Every wait is an event (a log line, a process exit, a step, a scrape) or a
bounded poll of an HTTP endpoint; each deadline only bounds a hang.

--scrape_interval_s longer than the default makes the job short against
the scrapes, as on a fast machine (with 5 s, Prometheus scrapes a quiet
machine's job about once on its own).

Usage: prometheus_e2e_test.py --ps BIN --worker BIN --prometheus BIN
                              --promtool BIN --source_dir DIR
                              [--scrape_interval_s S] [--keep]
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

POLL_S = 0.1  # polling interval of Prometheus's API
STEP_POLL_S = 0.02  # of worker 0's step: a hold lands within a few steps
WAIT_S = 120  # deadline of one wait: bounds a hang, never paces
HOLDS = 12  # evenly over the job: at least one scrape of the loss each
OUTAGE_ALERTS = ("DpPsDown|DpWorkerDown|DpWorkersMissing|DpTooFewWorkers|"
                 "DpTrainingStalled|DpLossNotFinite|DpCheckpointFailing|DpJobFailed")


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

    def exited(self):
        return self.proc.poll() is not None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()  # also ends a stopped process
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


def http_get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def metrics_of(process, port):
    """`process`'s /metrics answer; a network error fails, saying whether
    the process was still running."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        return http_get(url)
    except OSError as e:
        state = (f"it exited with {process.proc.returncode}"
                 if process.exited() else "it is running")
        raise Failure(f"GET {url} of {process.name}: {e} ({state})\n"
                      f"{process.tail()}")


class PrometheusApi:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path, **params):
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as e:  # a bad query: the reason in JSON
            body = json.loads(e.read().decode())
        except (OSError, ValueError) as e:
            raise Failure(f"GET {url}: {e}")
        if body.get("status") != "success":
            raise Failure(f"GET {url}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.get("/api/v1/query", **params)["result"]


def poll(what, deadline, probe, processes=(), interval=POLL_S):
    """Calls probe() until it returns a true value or the deadline passes;
    fails early when one of `processes` exits."""
    last = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except (Failure, OSError) as e:
            last = e
        for p in processes:
            if p.exited():
                raise Failure(f"{p.name} exited ({p.proc.returncode}) while "
                              f"waiting for {what}\n{p.tail()}")
        time.sleep(interval)  # polling interval, not synchronisation
    raise Failure(f"timed out waiting for {what}" + (f" (last: {last})" if last else ""))


def write_targets(path, targets):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump([{"targets": targets}], f)
    os.replace(tmp, path)  # Prometheus never reads a half-written file


def port_of(instance):
    return int(re.search(r":(\d+)$", instance)[1])


def run(args, tmp, processes):
    """Appends every process it starts to `processes` (the caller stops them)."""
    source = os.path.abspath(args.source_dir)
    rules_dir = os.path.join(source, "deploy", "prometheus", "rules")
    rule_files = sorted(os.path.join(rules_dir, n) for n in os.listdir(rules_dir))
    dashboard = mc.load_dashboard(
        os.path.join(source, "deploy", "grafana", "dashboards", "dp-ps.json"))
    start = time.monotonic()

    def say(text):
        print(f"[{time.monotonic() - start:5.1f}s] {text}", flush=True)

    # 1. Prometheus, with empty target files that are filled as the daemons
    #    come up (file discovery: their ports are picked at start). A scrape
    #    may take its whole interval: on a loaded machine a quick timeout
    #    reads as a daemon down.
    ps_targets = os.path.join(tmp, "ps-targets.json")
    worker_targets = os.path.join(tmp, "worker-targets.json")
    write_targets(ps_targets, [])
    write_targets(worker_targets, [])
    interval = f"{args.scrape_interval_s}s"
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval,
                   "evaluation_interval": "1s"},
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
            poll("Prometheus to be ready", time.monotonic() + WAIT_S,
                 lambda: http_get(f"{api.base}/-/ready"), [prom])
            break
        except Failure as e:
            prom.stop()
            if attempt == 2:
                raise
            print(f"retrying Prometheus: {e}")
    say(f"Prometheus ready on {api.base}, scraping every {interval}")

    # 2. dp-ps as two shards and two workers, every metrics port picked by
    #    the process. Shard 1 first, on any port; shard 0 needs every
    #    shard's address, its own included, so it gets a port picked here.
    #    No straggler backups and no reassignment: a held worker holds the
    #    step (else the other rank computes its block and the job runs on).
    deadline = time.monotonic() + WAIT_S
    job = ["--host=127.0.0.1", "--metrics_port=-1", "--metrics_host=127.0.0.1",
           "--workers=2", "--batch_size=256", "--epochs=3", "--seed=1",
           "--dataset=fashion-mnist", "--shards=2", "--backup_blocks=0",
           "--on_worker_loss=wait", "--start_wait_s=600"]
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
        say(f"worker {rank} backend: " +
            w.wait_for_line(r"backend: (.*)", deadline)[1])
        worker_metrics.append(int(w.wait_for_line(
            r"metrics on 0\.0\.0\.0:(\d+)", deadline)[1]))
    workers[1].proc.send_signal(signal.SIGSTOP)  # holds the job at step 0
    worker_host = "[::1]" if ipv6_loopback() else "127.0.0.1"
    write_targets(worker_targets, [f"{worker_host}:{p}" for p in worker_metrics])
    daemons = shards + workers
    # The daemons by metrics port: the targets' instances name them so.
    by_port = dict(zip(ps_metrics + worker_metrics, daemons))
    say(f"dp-ps metrics :{ps_metrics[0]} :{ps_metrics[1]}, workers "
        f"{worker_host}:{worker_metrics[0]} :{worker_metrics[1]}; rank 1 held")

    def last_scrapes():
        """{metrics port: time of its last successful scrape}. (timestamp()
        of an expression is the query's time: only a bare selector keeps
        the samples' own.)"""
        return {port_of(s["metric"]["instance"]): float(s["value"][1])
                for s in api.query("timestamp(up) and up == 1")}

    def scraping():
        active = api.get("/api/v1/targets", state="active")["activeTargets"]
        return ({port_of(re.search(r"//([^/]+)/", t["scrapeUrl"])[1])
                 for t in active} == set(by_port) and
                {*ps_metrics, worker_metrics[0]} <= set(last_scrapes()))

    poll("Prometheus to scrape both dp-ps shards and rank 0",
         time.monotonic() + WAIT_S, scraping, daemons)
    workers[1].proc.send_signal(signal.SIGCONT)
    planned = int(workers[0].wait_for_line(
        r"rank 0: joined at step \d+ of (\d+)", time.monotonic() + WAIT_S)[1])
    say(f"all targets discovered; rank 1 resumed; {planned} steps")

    # 3. The job, held HOLDS times evenly over its steps. Each hold ends
    #    once Prometheus has scraped every other target after the stop.
    #    Once a test accuracy (rank 0 reports one after every epoch) has
    #    been scraped, the test reads /metrics of the daemons that are not
    #    held, for the checks of step 5: after the first epoch, so that the
    #    holds after it give dp-ps two scrapes of Prometheus's in a row (it
    #    waits at its end for the next one, for as long as the last two
    #    requests of /metrics were apart).
    def worker0_step():
        text = metrics_of(workers[0], worker_metrics[0])
        m = re.search(r"^dp_worker_step_duration_seconds_count(?:\{[^}]*\})? "
                      r"(\S+)$", text, re.M)
        if m is None:
            raise Failure("worker 0's /metrics has no "
                          "dp_worker_step_duration_seconds_count")
        return int(float(m[1]))

    def step_reached(target):
        step = worker0_step()
        return step if step >= target else None

    texts = {}  # process name: its /metrics answer, read during a hold
    accuracy_scraped = False

    def hold(worker):
        nonlocal accuracy_scraped
        worker.proc.send_signal(signal.SIGSTOP)
        stopped = time.time()
        others = [p for p, d in by_port.items() if d is not worker]
        poll(f"a scrape of every target but the held {worker.name}",
             time.monotonic() + WAIT_S,
             lambda: all(last_scrapes().get(p, 0) > stopped for p in others),
             daemons)
        if not accuracy_scraped:
            accuracy_scraped = bool(api.query('dp_test_accuracy{role="ps"}'))
        if accuracy_scraped:
            for p in others:
                name = by_port[p].name
                if name not in texts:
                    texts[name] = metrics_of(by_port[p], p)
        worker.proc.send_signal(signal.SIGCONT)

    targets = [planned * k // (HOLDS + 1) for k in range(1, HOLDS + 1)]
    held_at = []
    while pending := [t for t in targets if not held_at or t > held_at[-1]]:
        step = poll(f"worker 0 at step {pending[0]}", time.monotonic() + WAIT_S,
                    lambda: step_reached(pending[0]), daemons,
                    interval=STEP_POLL_S)
        hold(workers[len(held_at) % 2])
        held_at.append(step)
    say(f"held the job at steps {held_at}, ranks 0 and 1 in turn")
    if len(texts) != len(daemons):
        raise Failure(f"no scraped test accuracy before the last hold: "
                      f"/metrics read only of {sorted(texts)}")

    # 4. The job ends well.
    for p in daemons:
        try:
            code = p.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            raise Failure(f"{p.name} did not finish in time\n{p.tail()}")
        if code != 0:
            raise Failure(f"{p.name} exited with {code}\n{p.tail()}")
    final = shard0.wait_for_line(r"final test accuracy: ([0-9.]+)",
                                 time.monotonic() + WAIT_S)
    say(f"job finished: {final[0]}")

    # 4b. How the job ended reached Prometheus before dp-ps exited: its last
    #     scrape holds the last step and the final accuracy it logged.
    def last(expr):
        r = api.query(f"last_over_time({expr}[1h])")
        return float(r[0]["value"][1]) if len(r) == 1 else None

    step = last('dp_training_step{role="ps",shard="0"}')
    accuracy = last('dp_test_accuracy{role="ps",shard="0"}')
    print(f"last scraped: step {step} of {planned}, accuracy {accuracy}")
    if step is None or step != planned:
        raise Failure(f"the last scraped step is {step}, not the job's last "
                      f"({planned}): dp-ps exited before a scrape of its end")
    if accuracy is None or abs(accuracy - float(final[1])) > 5e-5:
        raise Failure(f"the last scraped accuracy is {accuracy}, dp-ps "
                      f"reported {final[1]}: its final value was never scraped")
    # Every hold held: no block went to the other rank.
    for counter in ["dp_ps_backup_blocks_total", "dp_ps_blocks_reassigned_total"]:
        if (n := last(f'{counter}{{role="ps",shard="0"}}')) != 0:
            raise Failure(f"{counter} is {n}: a held worker's block was "
                          "computed by the other one, the hold did not hold")

    # 5. The daemons' own answers, read during holds: promtool's lint, and
    #    the names.
    families = {}
    for name, text in sorted(texts.items()):
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
    say(f"promtool check metrics: both dp-ps shards and both workers clean; "
        f"{len(families)} families")
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

    poll("every rule to evaluate", time.monotonic() + WAIT_S, rules_evaluated)

    # The last moment every daemon was still being scraped: later, their
    # series are stale (and a daemon that exited is down, as it should be).
    ends = [float(s["values"][-1][0]) for s in api.query("dp_build_info[1h]")]
    if len(ends) != 4:
        raise Failure(f"dp_build_info of {len(ends)} targets, not 4")
    at = min(ends) - 0.001

    # 7. No outage alert fired while the job trained normally. Pending is
    #    allowed: a held worker's scrapes fail, and its `up` is 0 until the
    #    hold ends (the alerts wait 1 minute). The straggler alert depends
    #    on this machine's load: not asserted.
    fired = api.query(f'ALERTS{{alertstate="firing",alertname=~"{OUTAGE_ALERTS}"}}[1h]',
                      at=at)
    if fired:
        raise Failure("alerts fired during a healthy run: " + "; ".join(
            f"{s['metric']} from {s['values'][0][0]}" for s in fired))

    # 8. samples/s > 0 for every rank during the run, from the recording
    #    rule the real Prometheus evaluated.
    by_rank = {s["metric"].get("rank"): float(s["value"][1]) for s in
               api.query("max_over_time(rank:dp_worker_samples:rate1m[1h])",
                         at=at)}
    say("samples/s by rank, the most: " +
        ", ".join(f"{k}: {v:.0f}" for k, v in sorted(by_rank.items())))
    if set(by_rank) != {"0", "1"} or not all(v > 0 for v in by_rank.values()):
        raise Failure(f"samples/s not > 0 on ranks 0 and 1: {by_rank}")

    # 9. The loss as scraped: a sample at least every hold and the last
    #    step's, falling.
    values = api.query('dp_training_loss{role="ps",shard="0"}[1h]')
    losses = [float(v) for _, v in values[0]["values"]] if len(values) == 1 else []
    say(f"{len(losses)} loss samples: first {losses[:3]}, last {losses[-3:]}")
    if len(losses) < 10:
        raise Failure(f"only {len(losses)} scrapes of the loss: {losses}")
    # Thirds, not single samples: each sample is one step's mini-batch loss.
    third = len(losses) // 3
    first = sum(losses[:third]) / third
    last_third = sum(losses[-third:]) / third
    print(f"mean loss of the first third {first:.3f}, last third {last_third:.3f}")
    if not (last_third < 0.85 * first and losses[-1] < losses[0]):
        raise Failure(f"the loss did not decrease: {losses}")

    # 10. Every dashboard expression returns data at the end of the run.
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
    say(f"all {len(mc.dashboard_expressions(dashboard))} dashboard "
        "expressions return data")


def main():
    ap = argparse.ArgumentParser()
    for flag in ["ps", "worker", "prometheus", "promtool", "source_dir"]:
        ap.add_argument(f"--{flag}", required=True)
    ap.add_argument("--scrape_interval_s", type=int, default=2,
                    help="Prometheus's scrape interval and timeout")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = ap.parse_args()
    if args.scrape_interval_s < 1:
        ap.error(f"--scrape_interval_s must be at least 1, got "
                 f"{args.scrape_interval_s}")
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
