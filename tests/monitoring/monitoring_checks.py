"""Checks of the Grafana dashboard and the Prometheus rules, shared by
deploy_files_test.py (static) and prometheus_e2e_test.py (against a real run).

Python 3 standard library plus PyYAML (Debian: python3-yaml), both installed
by scripts/setup.sh.
"""

import json
import os
import re
import subprocess
import tempfile

import yaml

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Grafana's interval macros and what they stand for when an expression is
# handed to promtool or to Prometheus directly.
GRAFANA_MACROS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    # The namespace variable's "All": also matches series without the label.
    "$namespace": ".*",
}

# Series Prometheus makes itself; the rest must come from the daemons or
# from our recording rules.
PROMETHEUS_BUILTIN = {"up", "ALERTS", "ALERTS_FOR_STATE"}

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
    "bool", "and", "or", "unless", "inf", "nan",
}


def load_dashboard(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)  # raises with line and column when invalid


def all_panels(dashboard):
    """Panels, including those nested in collapsed rows."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def to_promql(expr):
    """Replaces Grafana's macros; raises ValueError on any other variable."""
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    if "$" in expr:
        raise ValueError(f"unknown Grafana variable in {expr!r}")
    return expr


def dashboard_expressions(dashboard):
    """[(panel title, refId, PromQL)] of every query of every panel."""
    out = []
    for p in all_panels(dashboard):
        for t in p.get("targets", []):
            out.append((p.get("title", "?"), t.get("refId", "?"),
                        to_promql(t.get("expr", ""))))
    return out


def dashboard_legends(dashboard):
    """[(panel title, refId, PromQL, legendFormat)] of every query."""
    out = []
    for p in all_panels(dashboard):
        for t in p.get("targets", []):
            out.append((p.get("title", "?"), t.get("refId", "?"),
                        to_promql(t.get("expr", "")), t.get("legendFormat", "")))
    return out


def render_legend(legend, labels):
    """A series' name in the panel, as Grafana draws it from legendFormat."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}",
                  lambda m: labels.get(m.group(1), ""), legend)


def static_problems(dashboard):
    """What makes the dashboard unusable or unprovisionable, as sentences."""
    problems = []
    variables = dashboard.get("templating", {}).get("list", [])
    ds_vars = [v for v in variables
               if v.get("name") == "datasource" and v.get("type") == "datasource"]
    if len(ds_vars) != 1 or ds_vars[0].get("query") != "prometheus":
        problems.append("no template variable 'datasource' of type datasource "
                        "with query 'prometheus'")
    ns_vars = [v for v in variables if v.get("name") == "namespace"]
    if len(ns_vars) != 1 or ns_vars[0].get("type") != "query" or \
            ns_vars[0].get("allValue") != ".*" or not ns_vars[0].get("includeAll"):
        problems.append("no query variable 'namespace' with an All value of .* "
                        "(which also matches a local run's series)")
    if not dashboard.get("uid") or not dashboard.get("title"):
        problems.append("the dashboard needs a uid and a title")
    panels = all_panels(dashboard)
    if not panels:
        problems.append("no panels")
    ids = set()
    for p in panels:
        title = p.get("title", "")
        name = f"panel {p.get('id')} '{title}'"
        if p.get("type") == "row":
            # A heading over the panels below it: no queries of its own.
            # Open, it holds none (Grafana draws the panels that follow it);
            # collapsed, its panels are checked as any other (all_panels).
            if not isinstance(title, str) or not title.strip():
                problems.append(f"{name}: a row needs a title")
            if p.get("id") in ids:
                problems.append(f"{name}: duplicate id")
            ids.add(p.get("id"))
            if p.get("gridPos") != {"x": 0, "y": p.get("gridPos", {}).get("y"),
                                    "w": 24, "h": 1} or \
                    not isinstance(p["gridPos"].get("y"), int):
                problems.append(f"{name}: a row spans the width, 1 high, "
                                f"not {p.get('gridPos')!r}")
            if p.get("targets"):
                problems.append(f"{name}: a row has no queries")
            if not p.get("collapsed") and p.get("panels"):
                problems.append(f"{name}: an open row holds no panels (the "
                                "panels after it are its own)")
            continue
        if not isinstance(title, str) or not title.strip():
            problems.append(f"{name}: no title")
        if p.get("id") in ids:
            problems.append(f"{name}: duplicate id")
        ids.add(p.get("id"))
        if p.get("datasource") != DATASOURCE:
            problems.append(f"{name}: datasource is {p.get('datasource')!r}, "
                            f"not {DATASOURCE!r}")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not isinstance(unit, str) or not unit.strip():
            problems.append(f"{name}: no unit in fieldConfig.defaults")
        grid = p.get("gridPos", {})
        if not (grid.get("w", 0) > 0 and grid.get("h", 0) > 0 and
                grid.get("x", -1) >= 0 and grid.get("x", 0) + grid.get("w", 0) <= 24):
            problems.append(f"{name}: bad gridPos {grid!r}")
        targets = p.get("targets", [])
        if not targets:
            problems.append(f"{name}: no queries")
        refs = set()
        for t in targets:
            if t.get("datasource") != DATASOURCE:
                problems.append(f"{name} query {t.get('refId')}: datasource is "
                                f"{t.get('datasource')!r}")
            if not t.get("expr", "").strip():
                problems.append(f"{name} query {t.get('refId')}: empty expr")
            if t.get("refId") in refs or not t.get("refId"):
                problems.append(f"{name}: missing or duplicate refId")
            refs.add(t.get("refId"))
            try:
                to_promql(t.get("expr", ""))
            except ValueError as e:
                problems.append(f"{name}: {e}")
    return problems


def promtool_parse(promtool, named_exprs):
    """Parses [(name, expr)] with `promtool check rules` (as recording rules).
    Returns promtool's complaint, or None when every expression parses."""
    rules = {"groups": [{"name": "parse-check", "rules": [
        {"record": f"check:expr_{i}", "expr": expr}
        for i, (_, expr) in enumerate(named_exprs)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
        path = f.name
    try:
        r = subprocess.run([promtool, "check", "rules", path],
                           capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    if r.returncode == 0:
        return None
    index = {f"check:expr_{i}": name for i, (name, _) in enumerate(named_exprs)}
    out = r.stdout + r.stderr
    for record, name in index.items():
        out = out.replace(record, f"{record} ({name})")
    return out


def promtool_eval(promtool, input_series, cases, interval="1m"):
    """Evaluates expressions on made-up series with `promtool test rules`.
    input_series: [(series, values)] in promtool's notation; cases:
    [(name, expr, eval_time, [(labels, value)])], the samples expected.
    Returns promtool's complaint, or None when every case holds."""
    test = {"rule_files": [], "evaluation_interval": interval, "tests": [{
        "interval": interval,
        "input_series": [{"series": s, "values": v} for s, v in input_series],
        "promql_expr_test": [
            {"expr": expr, "eval_time": at,
             "exp_samples": [{"labels": l, "value": v} for l, v in samples]}
            for _, expr, at, samples in cases]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(test, f)
        path = f.name
    try:
        r = subprocess.run([promtool, "test", "rules", path],
                           capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    if r.returncode == 0:
        return None
    out = r.stdout + r.stderr
    for name, expr, _, _ in cases:  # promtool quotes them as Go does
        out = out.replace(f"expr: {json.dumps(expr)}",
                          f"'{name}' expr: {json.dumps(expr)}")
    return out


def metric_names(expr):
    """Metric names an expression selects. PromQL without a parser: strings,
    label matchers, ranges, offsets and grouping lists go first; of the
    identifiers left, those before '(' are functions or aggregations."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\boffset\s+-?\w+", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
               " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.:])[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def exported_families(exposition_text):
    """{family name: type} from the '# TYPE' lines of a /metrics answer."""
    families = {}
    for line in exposition_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families[name] = kind.strip()
    return families


def unknown_names(names, families, recorded):
    """Names that neither the daemons export nor our rules record."""
    unknown = set()
    for n in names:
        if n in families or n in recorded or n in PROMETHEUS_BUILTIN:
            continue
        base = re.sub(r"_(bucket|sum|count)$", "", n)
        if base != n and families.get(base) in ("histogram", "summary"):
            continue
        unknown.add(n)
    return unknown


def load_rules(paths):
    """[(group, rule dict)] of Prometheus rule files."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for g in doc.get("groups", []):
            for r in g.get("rules", []):
                out.append((g["name"], r))
    return out


def recorded_names(rules):
    return {r["record"] for _, r in rules if "record" in r}


def namespace_problems(expr):
    """Why `expr` could mix jobs of different namespaces: a dp_ selector
    without the namespace matcher, or an aggregation that drops the label."""
    problems = []
    for m in re.finditer(r"\b(dp_[a-z_]+)(\{[^}]*\})?", expr):
        if 'namespace=~"$namespace"' not in (m.group(2) or ""):
            problems.append(f"{m.group(1)} is not filtered by namespace")
    for m in re.finditer(r"\b(sum|avg|min|max|count|topk|bottomk|quantile)\s*"
                         r"(by\s*\(([^)]*)\))?\s*\(", expr):
        labels = [x.strip() for x in (m.group(3) or "").split(",")]
        if m.group(1) in ("topk", "bottomk", "quantile") and not m.group(2):
            continue  # keeps the labels of its argument
        if "namespace" not in labels:
            problems.append(f"{m.group(0).strip()} aggregates away namespace")
    return problems


def documented_metrics(doc_text):
    """{name: type} of the metric table of docs/monitoring.md: its rows
    "| `dp_name{labels}` | type | role | meaning |"."""
    out = {}
    for m in re.finditer(r"^\|\s*`(dp_[a-z0-9_]+)[^`]*`\s*\|\s*(\w+)\s*\|",
                         doc_text, re.M):
        out[m.group(1)] = m.group(2)
    return out


def code_metrics(source_dir):
    """Names of the families the daemons register, in common/, server/ and
    worker/: a dp_ string literal given to a prometheus-cpp builder's Name()
    or followed by more arguments (the help), as the registry's helpers take
    them."""
    names = set()
    for part in ("common", "server", "worker"):
        for root, _, files in os.walk(os.path.join(source_dir, part)):
            for n in files:
                if not n.endswith((".cc", ".h")):
                    continue
                with open(os.path.join(root, n), encoding="utf-8") as f:
                    text = f.read()
                for m in re.finditer(r'\.Name\(\s*"(dp_[a-z0-9_]+)"\s*\)|'
                                     r'"(dp_[a-z0-9_]+)"\s*,', text):
                    names.add(m.group(1) or m.group(2))
    return names


def grouping_labels(expr):
    """Labels of every `by (...)` of an expression."""
    labels = set()
    for m in re.finditer(r"\bby\s*\(([^)]*)\)", expr):
        labels.update(x.strip() for x in m.group(1).split(",") if x.strip())
    return labels


def legend_problems(expr, legend):
    """Why a query's legend could draw two series under one name once the
    namespace variable is "All" (several runs): it must name namespace,
    and every label the query groups by (le is the quantile's own)."""
    named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    missing = ({"namespace"} | grouping_labels(expr)) - {"le"} - named
    return [f"legend {legend!r} does not name {{{{{label}}}}}"
            for label in sorted(missing)]


def quantiles(expr):
    """The q of every histogram_quantile(q, ...), as "p50", "p99", ..."""
    return {f"p{float(q) * 100:g}" for q in
            re.findall(r"\bhistogram_quantile\s*\(\s*([0-9.]+)\s*,", expr)}
