#!/usr/bin/env python3
"""Static checks of deploy/grafana and deploy/prometheus (no processes):
the dashboard is valid JSON, every panel has a title and a unit and queries
the ${datasource} variable, every expression parses (promtool), the
provisioning files point where docs/monitoring.md says, and every alert
explains itself (its runbook_url names a section of docs/monitoring.md).
Whether the expressions name real metrics is checked against a real run by
prometheus_e2e_test.py.

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
