#!/usr/bin/env node
// Renders deploy/prometheus/rules/*.yml (the rules promtool tests) as the
// prometheus-operator's PrometheusRule of deploy/k8s/monitoring, so that a
// kube-prometheus-stack gets exactly those rules.
//   node deploy/tests/render-prometheus-rule.js          # rewrite the file
//   node deploy/tests/render-prometheus-rule.js --check  # exit 1 if stale
"use strict";

const fs = require("fs");
const path = require("path");
const YAML = require("yaml");

const REPO = path.resolve(__dirname, "../..");
const RULES = path.join(REPO, "deploy/prometheus/rules");
const OUT = path.join(REPO, "deploy/k8s/monitoring/prometheus-rule.yaml");

// The rule groups of every rules file, in file-name order.
function ruleGroups() {
  return fs.readdirSync(RULES).filter((n) => n.endsWith(".yml")).sort()
      .flatMap((n) => YAML.parse(fs.readFileSync(path.join(RULES, n), "utf8")).groups);
}

function render() {
  const rule = {
    apiVersion: "monitoring.coreos.com/v1",
    kind: "PrometheusRule",
    metadata: {name: "dp-ps", labels: {"app.kubernetes.io/name": "dp-ps"}},
    spec: {groups: ruleGroups()},
  };
  return "# Generated from deploy/prometheus/rules by " +
         "deploy/tests/render-prometheus-rule.js:\n# edit the rules there " +
         "and run it again (the deploy tests check that it is current).\n" +
         YAML.stringify(rule, {lineWidth: 0});
}

module.exports = {ruleGroups, render, OUT};

if (require.main === module) {
  const text = render();
  if (process.argv.includes("--check")) {
    const current = fs.existsSync(OUT) ? fs.readFileSync(OUT, "utf8") : "";
    if (current !== text) {
      console.error(`${path.relative(REPO, OUT)} is not the rendering of ` +
                    `deploy/prometheus/rules: run node ${path.relative(REPO, __filename)}`);
      process.exit(1);
    }
    console.log(`ok    ${path.relative(REPO, OUT)} is deploy/prometheus/rules`);
  } else {
    fs.writeFileSync(OUT, text);
  }
}
