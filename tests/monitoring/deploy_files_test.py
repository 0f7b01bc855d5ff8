#!/usr/bin/env python3
"""Static checks of deploy/grafana and deploy/prometheus (no processes):
the dashboard is valid JSON, every panel has a title and a unit and queries
the ${datasource} variable, every expression parses (promtool), the
provisioning files point where docs/monitoring.md says, and every alert
explains itself (its runbook_url names a section of docs/monitoring.md).
The panels a run is read from exist; every legend names the namespace, so
that several runs on one panel stay apart; a panel's title names the
quantiles it draws, and the worker's and dp-ps's views of the exchange draw
the same. The metrics the dashboard and the rules select are those of
docs/monitoring.md's table, which are those the C++ registers; that they
have data in a real run is checked by prometheus_e2e_test.py.

Usage: deploy_files_test.py --source_dir DIR --promtool PATH
"""

import argparse
import os
import re
import sys

import yaml

import monitoring_checks as mc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "docs"))
import doc_links  # noqa: E402


def raw_targets(dashboard):
    """[(panel title, refId, expression as written)] of every query."""
    return [(p.get("title", "?"), t.get("refId", "?"), t.get("expr", ""))
            for p in mc.all_panels(dashboard) for t in p.get("targets", [])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source_dir", required=True)
    ap.add_argument("--promtool", required=True)
    args = ap.parse_args()
    deploy = os.path.join(args.source_dir, "deploy")
    failures = []

    # The dashboard.
    path = os.path.join(deploy, "grafana", "dashboards", "dp-ps.json")
    try:
        dashboard = mc.load_dashboard(path)
    except ValueError as e:
        print(f"FAIL {path} is not valid JSON: {e}")
        return 1
    failures += mc.static_problems(dashboard)
    try:
        exprs = mc.dashboard_expressions(dashboard)
    except ValueError as e:  # already reported by static_problems
        exprs = []
    print(f"{len(mc.all_panels(dashboard))} panels, {len(exprs)} expressions")
    complaint = mc.promtool_parse(
        args.promtool, [(f"{title} {ref}", e) for title, ref, e in exprs])
    if complaint:
        failures.append(f"promtool cannot parse a dashboard expression:\n{complaint}")
    for title, ref, t in raw_targets(dashboard):
        for problem in mc.namespace_problems(t):
            failures.append(f"'{title}' {ref}: {problem}")
    for title, ref, e in exprs:
        if not mc.metric_names(e):
            failures.append(f"'{title}' {ref} selects no metric: {e}")
    # After a run, the stat row shows how it ended: each stat query is the
    # last value over the dashboard's range, not an instant sample that is
    # gone once the processes have exited (Prometheus marks it stale).
    for p in mc.all_panels(dashboard):
        if p.get("type") != "stat":
            continue
        for t in p.get("targets", []):
            if "[$__range]" not in t.get("expr", ""):
                failures.append(f"stat '{p['title']}' {t.get('refId')}: shows "
                                "nothing once the job's processes are gone "
                                "(want a value over [$__range])")
    # A latency quantile only where there were calls: a histogram that never
    # observed (e.g. Push with the fused protocol) gives NaN, a legend entry
    # with no line.
    for title, ref, t in raw_targets(dashboard):
        if "histogram_quantile" in t and not re.search(
                r"\band\b.*_count\{.*\)\s*>\s*0\s*$", t):
            failures.append(f"'{title}' {ref}: histogram_quantile without "
                            "'and <its _count rate> > 0'")
    # Every legend names the namespace and each label its query groups by:
    # with "All", the runs of several namespaces share each panel, and a
    # legend without namespace draws two runs' rank 0 under one name.
    for p in mc.all_panels(dashboard):
        for t in p.get("targets", []):
            for problem in mc.legend_problems(t.get("expr", ""),
                                              t.get("legendFormat", "")):
                failures.append(f"'{p['title']}' {t.get('refId')}: {problem}")
    # A panel "per rank" or "by rank" keeps the ranks apart in every query
    # (a quantile pooled over the ranks says nothing about any one of them).
    for p in mc.all_panels(dashboard):
        if re.search(r"\b(per|by) rank\b", p.get("title", "")):
            for t in p.get("targets", []):
                if "rank" not in mc.grouping_labels(t.get("expr", "")):
                    failures.append(f"'{p['title']}' {t.get('refId')}: does "
                                    "not keep rank (want by (..., rank))")
    # The title names the quantiles the panel draws, and the exchange as the
    # workers see it and as dp-ps sees it is drawn at the same quantile, so
    # that the two panels can be read against each other.
    side_quantiles = {}
    for p in mc.all_panels(dashboard):
        drawn = set().union(*[mc.quantiles(t.get("expr", ""))
                              for t in p.get("targets", [])])
        named = set(re.findall(r"\bp\d+(?:\.\d+)?\b", p.get("title", "")))
        if drawn != named:
            failures.append(f"'{p['title']}': draws quantiles "
                            f"{sorted(drawn)}, its title names {sorted(named)}")
        for side in ("worker side", "dp-ps side"):
            if f"({side})" in p.get("title", ""):
                side_quantiles.setdefault(side, set()).update(drawn)
    if len(side_quantiles) != 2 or \
            len({frozenset(q) for q in side_quantiles.values()}) != 1:
        failures.append("the '(worker side)' and '(dp-ps side)' latency panels "
                        f"draw different quantiles (or one is missing): "
                        f"{ {k: sorted(v) for k, v in side_quantiles.items()} }")

    # The panels the issue asks for, by title.
    titles = {p["title"] for p in mc.all_panels(dashboard)}
    for wanted in ["Training loss", "Test accuracy", "Samples/s (total)",
                   "Samples/s per rank", "Step time p50 / p99",
                   "Workers: active vs expected", "Slowest rank", "Bytes/s",
                   "Elasticity", "Live workers", "Micro-batches per worker",
                   "Blocks reassigned / backups / duplicates",
                   "Steps waited for, by rank"]:
        if wanted not in titles:
            failures.append(f"no panel titled '{wanted}'")
    # ... and those that show what a run was and how far it got, by title and
    # by the metrics their queries select.
    selected = {}
    for title, _, e in exprs:
        selected.setdefault(title, set()).update(mc.metric_names(e))
    for wanted, metrics in {
            "Test loss": {"dp_test_loss"},
            "Progress": {"dp_training_step", "dp_training_planned_steps"},
            "ETA": {"dp_training_step", "dp_training_planned_steps"},
            "Step time p50 per rank": {"dp_worker_step_duration_seconds_bucket"},
            "Backend and data plane per rank": {"dp_worker_backend_info",
                                                "dp_worker_shared_memory"},
    }.items():
        if wanted not in titles:
            failures.append(f"no panel titled '{wanted}'")
        elif not metrics <= selected.get(wanted, set()):
            failures.append(f"'{wanted}' does not select "
                            f"{sorted(metrics - selected.get(wanted, set()))}")

    # What the progress and plane panels compute, on series whose answer is
    # known: a job 1200 of 6000 steps in at 1 step/s; one that ran to its end
    # and whose processes are gone; one waiting for its first worker
    # (planned 0); one stalled half way. Ranks 0 (two pods one after the
    # other) and 1 joined, rank 2 has not yet (no data plane).
    ps = 'job="dp-ps",instance="p",role="ps",shard="0"'
    series = [
        (f'dp_training_step{{namespace="a",{ps}}}', "0+60x20"),
        (f'dp_training_planned_steps{{namespace="a",{ps}}}', "6000x20"),
        (f'dp_training_step{{namespace="b",{ps}}}', "0+100x10"),
        (f'dp_training_planned_steps{{namespace="b",{ps}}}', "1000x10"),
        (f'dp_training_step{{namespace="c",{ps}}}', "0x20"),
        (f'dp_training_planned_steps{{namespace="c",{ps}}}', "0x20"),
        (f'dp_training_step{{namespace="d",{ps}}}', "0+100x5 500x15"),
        (f'dp_training_planned_steps{{namespace="d",{ps}}}', "1000x20"),
    ]
    worker = 'job="dp-worker",role="worker"'
    cuda = 'backend="cuda",device="0",gpu="NVIDIA H200",compute_capability="9.0"'
    for ns, rank, pod, backend, shm, values in [
            ("a", "0", "w0", cuda, "1", "1x10"),
            ("a", "0", "w0b", cuda, "1", "_x10 1x10"),
            ("a", "1", "w1", 'backend="cpu"', "0", "1x20"),
            ("a", "2", "w2", 'backend="cpu"', None, "1x20"),
            ("b", "0", "w0", 'backend="cpu"', "1", "1x10")]:
        labels = f'namespace="{ns}",rank="{rank}",instance="{pod}",{worker}'
        series.append((f"dp_worker_backend_info{{{labels},{backend}}}", values))
        if shm is not None:
            series.append((f"dp_worker_shared_memory{{{labels}}}",
                           values.replace("1x", f"{shm}x")))
    panel_expr = {title: e for title, ref, e in exprs if ref == "A"}
    cases = [(title, panel_expr[title], "20m", samples)
             for title, samples in [
                 ("Progress", [('{namespace="a"}', 0.2), ('{namespace="b"}', 1),
                               ('{namespace="d"}', 0.5)]),
                 ("ETA", [('{namespace="a"}', 4800), ('{namespace="b"}', 0)]),
                 ("Backend and data plane per rank", [
                     ('{namespace="a",rank="0",backend="cuda",device="0",'
                      'gpu="NVIDIA H200"}', 1),
                     ('{namespace="a",rank="1",backend="cpu"}', 0),
                     ('{namespace="b",rank="0",backend="cpu"}', 1)]),
             ] if title in panel_expr]
    complaint = mc.promtool_eval(args.promtool, series, cases)
    if complaint:
        failures.append("a progress or plane panel computes the wrong values:\n"
                        f"{complaint}")

    # Grafana provisioning.
    prov = os.path.join(deploy, "grafana", "provisioning")
    with open(os.path.join(prov, "datasources", "dp-ps.yml")) as f:
        ds = yaml.safe_load(f)
    if ds.get("apiVersion") != 1 or not any(
            d.get("type") == "prometheus" and d.get("url")
            for d in ds.get("datasources", [])):
        failures.append("datasource provisioning has no Prometheus with a url")
    with open(os.path.join(prov, "dashboards", "dp-ps.yml")) as f:
        dp = yaml.safe_load(f)
    providers = dp.get("providers", [])
    if dp.get("apiVersion") != 1 or not providers or any(
            p.get("type") != "file" or not p.get("options", {}).get("path")
            for p in providers):
        failures.append("dashboard provisioning needs file providers with a path")

    # Alerts say what is wrong and how bad it is.
    rules_dir = os.path.join(deploy, "prometheus", "rules")
    rules = mc.load_rules(sorted(
        os.path.join(rules_dir, n) for n in os.listdir(rules_dir)))
    alerts = [r for _, r in rules if "alert" in r]
    for r in alerts:
        ann = r.get("annotations", {})
        if not ann.get("summary") or not ann.get("description"):
            failures.append(f"alert {r['alert']}: summary and description needed")
        if r.get("labels", {}).get("severity") not in ("critical", "warning"):
            failures.append(f"alert {r['alert']}: severity critical or warning")
    # Every alert links its section of the runbook.
    for r in alerts:
        url = r.get("annotations", {}).get("runbook_url", "")
        problem = (doc_links.target_problem(args.source_dir, url)
                   if url.startswith("docs/monitoring.md#")
                   else "is not docs/monitoring.md#<section>")
        if problem:
            failures.append(f"alert {r['alert']}: runbook_url {url!r}: {problem}")
    # Aggregations keep namespace, so jobs in different namespaces stay apart.
    for _, r in rules:
        for m in re.finditer(r"\b(sum|avg|min|max|count)\s*(by\s*\(([^)]*)\))?\s*\(",
                             r["expr"]):
            labels = [x.strip() for x in (m.group(3) or "").split(",")]
            if "namespace" not in labels:
                failures.append(f"{r.get('alert') or r.get('record')}: "
                                f"{m.group(0).strip()} aggregates away namespace")
    # The metrics: docs/monitoring.md lists what the C++ registers, and the
    # dashboard and the rules select only those, our recorded series and
    # Prometheus's own.
    with open(os.path.join(args.source_dir, "docs", "monitoring.md"),
              encoding="utf-8") as f:
        documented = mc.documented_metrics(f.read())
    registered = mc.code_metrics(args.source_dir)
    for n in sorted(registered - set(documented)):
        failures.append(f"{n} is registered in the code but missing from the "
                        "metric table of docs/monitoring.md")
    for n in sorted(set(documented) - registered):
        failures.append(f"docs/monitoring.md lists {n}, which no daemon "
                        "registers")
    recorded = mc.recorded_names(rules)
    for what, e in [(f"dashboard '{t}' {ref}", e) for t, ref, e in exprs] + \
            [(f"rule {r.get('alert') or r.get('record')}", r["expr"])
             for _, r in rules]:
        unknown = mc.unknown_names(mc.metric_names(e), documented, recorded)
        if unknown:
            failures.append(f"{what} selects metrics that are not in "
                            f"docs/monitoring.md: {sorted(unknown)}")
    names = {r["alert"] for r in alerts}
    for wanted in ["DpWorkerDown", "DpPsAbsent", "DpLossNotFinite", "DpLossRising",
                   "DpTrainingStalled", "DpStraggler", "DpCheckpointFailing",
                   "DpJobFailed"]:
        if wanted not in names:
            failures.append(f"no alert {wanted}")

    for f in failures:
        print(f"FAIL {f}")
    print("OK" if not failures else f"{len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
