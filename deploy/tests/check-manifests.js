#!/usr/bin/env node
// Offline checks of deploy/k8s, run by ctest (no cluster needed):
//  1. `kubectl kustomize` renders the base and every overlay;
//  2. every rendered object validates against the Kubernetes and
//     prometheus-operator schemas (kubernetes-models: types, required
//     fields, enums), and has no field those schemas lack (TypeScript's
//     excess-property check over the same models' interfaces);
//  3. drift between the manifests and the binaries: each container's
//     arguments and environment are run through `dp-ps`/`dp-worker
//     --dry_run`, and the ports, probes, Service, worker count, failure
//     policy, grace periods and volumes are compared with the effective
//     configuration the binaries print;
//  4. a self-test: broken copies of the manifests must fail each check.
//
// Usage: node check-manifests.js --dp-ps BIN --dp-worker BIN
// Exit status 0 when every check passes.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync, spawnSync } = require("child_process");
const YAML = require("yaml");

const HERE = __dirname;
const REPO = path.resolve(HERE, "../..");
const K8S = path.join(REPO, "deploy/k8s");
const TARGETS = ["base", "overlays/gpu", "overlays/cpu"];
// The dashboard of the monitoring branch, when it is there.
const GRAFANA_DASHBOARD = path.join(REPO, "deploy/grafana/dashboards/dp-ps.json");
const COMPONENT_DASHBOARD = path.join(
    K8S, "components/monitoring/dashboards/dp-ps.json");
// Exit code of a configuration error (common/flags.h kExitConfigError).
const EXIT_CONFIG_ERROR = 2;

function parseArgs(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i += 2) {
    args[argv[i].replace(/^--/, "")] = argv[i + 1];
  }
  for (const need of ["dp-ps", "dp-worker"]) {
    if (!args[need]) {
      console.error(`usage: check-manifests.js --dp-ps BIN --dp-worker BIN`);
      process.exit(2);
    }
  }
  return args;
}

// ---------------------------------------------------------------- render

function render(target) {
  const out = execFileSync("kubectl", ["kustomize", path.join(K8S, target)],
                           {encoding: "utf8", stdio: ["ignore", "pipe", "pipe"]});
  return YAML.parseAllDocuments(out).map((d) => d.toJS()).filter(Boolean);
}

// ---------------------------------------------------------------- schemas

// kubernetes-models module and TypeScript import for an apiVersion.
function modelModule(apiVersion) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
  }
  return `kubernetes-models/${apiVersion}`;
}

// Errors of the kubernetes-models validation of `obj` (types, required
// fields, enums, formats).
function schemaErrors(obj) {
  let mod;
  try {
    mod = require(modelModule(obj.apiVersion));
  } catch (e) {
    return [`no schema for apiVersion ${obj.apiVersion}`];
  }
  const Model = mod[obj.kind];
  if (!Model) return [`no schema for ${obj.apiVersion} ${obj.kind}`];
  try {
    new Model(obj).validate();
    return [];
  } catch (e) {
    return [e.message];
  }
}

// Fields that the schemas do not know, found by TypeScript: each object is
// a literal assigned to the model's interface, so an unknown field anywhere
// in it is an excess-property error. `objects` is [{label, obj}].
function unknownFieldErrors(objects) {
  const ts = require("typescript");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "dp-manifests-"));
  const file = path.join(dir, "objects.ts");
  const lines = [];
  objects.forEach(({obj}, i) => {
    const type = `I${obj.kind}`;
    lines.push(`import type { ${type} as T${i} } from ` +
               `"${modelModule(obj.apiVersion)}/${obj.kind}";`);
    lines.push(`export const o${i}: T${i} = ${JSON.stringify(obj)};`);
  });
  fs.writeFileSync(file, lines.join("\n") + "\n");
  const program = ts.createProgram([file], {
    noEmit: true,
    strict: true,
    skipLibCheck: true,
    module: ts.ModuleKind.CommonJS,
    moduleResolution: ts.ModuleResolutionKind.Node10,
    target: ts.ScriptTarget.ES2020,
    baseUrl: path.join(HERE, "node_modules"),
    typeRoots: [],
  });
  const errors = ts.getPreEmitDiagnostics(program).map((d) => {
    const text = ts.flattenDiagnosticMessageText(d.messageText, "\n");
    if (!d.file) return text;
    const {line} = d.file.getLineAndCharacterOfPosition(d.start);
    // Line 2i+1 (0-based) holds object i.
    const label = objects[Math.floor(line / 2)]?.label ?? "?";
    return `${label}: ${text}`;
  });
  fs.rmSync(dir, {recursive: true, force: true});
  return errors;
}

// ---------------------------------------------------------------- drift

function find(objects, kind, name) {
  return objects.find((o) => o.kind === kind && o.metadata.name === name);
}

function containerPort(container, name) {
  const p = (container.ports || []).find((q) => q.name === name);
  return p ? p.containerPort : undefined;
}

// Runs `binary --dry_run` with the container's arguments and environment,
// as the kubelet would start it: ConfigMaps of envFrom resolved from the
// rendered objects, JOB_COMPLETION_INDEX set for an Indexed Job. Returns
// {code, config (flag -> value), output}.
function dryRun(binary, container, objects, extraEnv) {
  const env = {PATH: process.env.PATH, ...extraEnv};
  const problems = [];
  for (const from of container.envFrom || []) {
    if (!from.configMapRef) {
      problems.push(`envFrom other than configMapRef`);
      continue;
    }
    const cm = find(objects, "ConfigMap", from.configMapRef.name);
    if (!cm) {
      problems.push(`ConfigMap ${from.configMapRef.name} is not rendered`);
      continue;
    }
    Object.assign(env, cm.data || {});
  }
  for (const e of container.env || []) {
    if (e.value !== undefined) {
      env[e.name] = e.value;
    } else {
      problems.push(`env ${e.name} has no literal value`);
    }
  }
  const argv = [...(container.command || []).slice(1), ...(container.args || []),
                "--dry_run"];
  const r = spawnSync(binary, argv, {env, encoding: "utf8"});
  const config = {};
  for (const line of (r.stdout || "").split("\n")) {
    const m = /^--([a-z_]+)=(.*)$/.exec(line);
    if (m) config[m[1]] = m[2];
  }
  return {code: r.status, config, output: (r.stdout || "") + (r.stderr || ""),
          problems};
}

function labelsMatch(selector, labels) {
  return Object.entries(selector || {}).every(([k, v]) => labels[k] === v);
}

// The drift checks of one rendered overlay; returns a list of errors.
function driftErrors(objects, bins, target) {
  const errors = [];
  const check = (cond, message) => {
    if (!cond) errors.push(message);
  };

  const sts = find(objects, "StatefulSet", "dp-ps");
  const svc = find(objects, "Service", "dp-ps");
  const job = find(objects, "Job", "dp-worker");
  const pdb = objects.find((o) => o.kind === "PodDisruptionBudget");
  if (!sts || !svc || !job || !pdb) {
    return ["expected StatefulSet dp-ps, Service dp-ps, Job dp-worker and " +
            "a PodDisruptionBudget"];
  }
  const ps = sts.spec.template.spec.containers.find((c) => c.name === "dp-ps");
  const worker =
      job.spec.template.spec.containers.find((c) => c.name === "dp-worker");
  if (!ps || !worker) return ["expected containers dp-ps and dp-worker"];
  check(sts.spec.template.spec.containers.length === 1 &&
            job.spec.template.spec.containers.length === 1,
        "one container per pod (the binaries are checked by container name)");
  check(/(^|\/)dp-ps(:|@|$)/.test(ps.image), `dp-ps image is ${ps.image}`);
  check(/(^|\/)dp-worker(:|@|$)/.test(worker.image),
        `dp-worker image is ${worker.image}`);

  // Every argument and DP_* variable is accepted by the binary.
  const psRun = dryRun(bins["dp-ps"], ps, objects, {});
  const wRun = dryRun(bins["dp-worker"], worker, objects,
                      {JOB_COMPLETION_INDEX: "0"});
  for (const [name, run] of [["dp-ps", psRun], ["dp-worker", wRun]]) {
    for (const p of run.problems) errors.push(`${name}: ${p}`);
    check(run.code === 0,
          `${name} --dry_run with the manifest's configuration exited ` +
          `${run.code}:\n${run.output}`);
  }
  if (psRun.code !== 0 || wRun.code !== 0) return errors;
  const pc = psRun.config;
  const wc = wRun.config;

  // dp-ps: ports, Service, probes.
  const grpcPort = Number(pc.port);
  check(containerPort(ps, "grpc") === grpcPort,
        `dp-ps containerPort grpc ${containerPort(ps, "grpc")} != --port ` +
        `${pc.port}`);
  const metricsPort = Number(pc.metrics_port);
  check(metricsPort > 0 && containerPort(ps, "metrics") === metricsPort,
        `dp-ps containerPort metrics ${containerPort(ps, "metrics")} != ` +
        `--metrics_port ${pc.metrics_port}`);
  check(pc.host === "0.0.0.0" || pc.host === "::",
        `dp-ps --host=${pc.host} is not reachable from other pods`);
  check(svc.spec.clusterIP === "None", "the dp-ps Service is not headless");
  check(sts.spec.serviceName === svc.metadata.name,
        "StatefulSet serviceName is not the Service");
  check(sts.spec.replicas === 1, "dp-ps must have exactly 1 replica");
  check(labelsMatch(svc.spec.selector, sts.spec.template.metadata.labels),
        "the Service does not select the dp-ps pod");
  const svcPort = (name) => (svc.spec.ports || []).find((p) => p.name === name);
  for (const name of ["grpc", "metrics"]) {
    const p = svcPort(name);
    check(p, `Service has no port named ${name}`);
    if (!p) continue;
    const target = typeof p.targetPort === "string"
        ? containerPort(ps, p.targetPort) : (p.targetPort ?? p.port);
    check(target === containerPort(ps, name),
          `Service port ${name} targets ${p.targetPort}, not the ` +
          `container's ${name} port`);
  }
  for (const kind of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const probe = ps[kind];
    check(probe && probe.grpc, `dp-ps has no grpc ${kind}`);
    if (!probe || !probe.grpc) continue;
    check(probe.grpc.port === grpcPort,
          `dp-ps ${kind} port ${probe.grpc.port} != --port ${grpcPort}`);
    const service = probe.grpc.service || "";
    // common/grpc_server.h: readiness is "", liveness is "liveness".
    check(service === (kind === "livenessProbe" ? "liveness" : ""),
          `dp-ps ${kind} checks service '${service}'`);
  }

  // dp-ps writes only to mounted volumes (the root filesystem is read-only).
  const mounts = (ps.volumeMounts || []).map((m) => m.mountPath);
  const claims = (sts.spec.volumeClaimTemplates || []).map((v) => v.metadata.name);
  check(claims.length > 0, "dp-ps has no volume claim for its state");
  check((ps.volumeMounts || []).some((m) => claims.includes(m.name)),
        "the state volume is not mounted in dp-ps");
  for (const flag of ["save_model", "checkpoint_dir"]) {
    const value = pc[flag];
    if (!value) continue;
    check(mounts.some((m) => value === m || value.startsWith(m + "/")),
          `dp-ps --${flag}=${value} is not on a mounted volume`);
  }
  check(pc.exit_when_done === "false",
        "dp-ps must keep running after training (--exit_when_done=false): " +
        "a StatefulSet restarts a container that exits");

  // Workers: the address of dp-ps, the rank, the count.
  const [psHost, psPort] = [wc.ps.slice(0, wc.ps.lastIndexOf(":")),
                            Number(wc.ps.slice(wc.ps.lastIndexOf(":") + 1))];
  check(psHost === svc.metadata.name ||
            psHost.startsWith(`${svc.metadata.name}.`) ||
            psHost === `${sts.metadata.name}-0.${svc.metadata.name}`,
        `worker --ps=${wc.ps} does not name the Service ${svc.metadata.name}`);
  check(svcPort("grpc") && psPort === svcPort("grpc").port,
        `worker --ps port ${psPort} is not the Service's grpc port`);
  check(wc.rank === "0", `worker rank from JOB_COMPLETION_INDEX: ${wc.rank}`);
  check(job.spec.completionMode === "Indexed", "the Job is not Indexed");
  check(job.spec.completions === Number(pc.workers) &&
            job.spec.parallelism === Number(pc.workers),
        `Job completions ${job.spec.completions} / parallelism ` +
        `${job.spec.parallelism} != dp-ps --workers ${pc.workers}`);
  check(job.spec.template.spec.restartPolicy === "Never",
        "podFailurePolicy needs restartPolicy Never");

  // Worker probes and ports.
  const healthPort = Number(wc.health_port);
  check(healthPort > 0 && containerPort(worker, "health") === healthPort,
        `worker containerPort health ${containerPort(worker, "health")} != ` +
        `--health_port ${wc.health_port}`);
  for (const kind of ["startupProbe", "readinessProbe"]) {
    const probe = worker[kind];
    check(probe && probe.grpc && probe.grpc.port === healthPort,
          `worker ${kind} is not a grpc probe on --health_port ${healthPort}`);
  }
  check(!worker.livenessProbe || worker.livenessProbe.grpc?.service === "liveness",
        "a worker liveness probe must check the 'liveness' service");
  if (Number(wc.metrics_port) > 0) {
    check(containerPort(worker, "metrics") === Number(wc.metrics_port),
          `worker containerPort metrics != --metrics_port ${wc.metrics_port}`);
  }

  // Failure policy: configuration errors fail the Job; disruptions ignored.
  const rules = job.spec.podFailurePolicy?.rules || [];
  check(rules.some((r) => r.action === "FailJob" &&
                          r.onExitCodes?.operator === "In" &&
                          r.onExitCodes.values.includes(EXIT_CONFIG_ERROR) &&
                          r.onExitCodes.containerName === worker.name),
        `no FailJob rule for exit code ${EXIT_CONFIG_ERROR} of ${worker.name}`);
  check(rules.some((r) => r.action === "Ignore" &&
                          (r.onPodConditions || []).some(
                              (c) => c.type === "DisruptionTarget")),
        "no Ignore rule for DisruptionTarget");

  // Grace periods cover the stops.
  const workerGrace = job.spec.template.spec.terminationGracePeriodSeconds;
  check(workerGrace > Number(wc.stop_timeout_s),
        `worker terminationGracePeriodSeconds ${workerGrace} <= ` +
        `--stop_timeout_s ${wc.stop_timeout_s}`);
  const psGrace = sts.spec.template.spec.terminationGracePeriodSeconds;
  // dp-ps: the drain hook (a checkpoint) plus 2 s of gRPC shutdown.
  check(psGrace >= 30, `dp-ps terminationGracePeriodSeconds ${psGrace} < 30`);

  // Requests and limits everywhere.
  for (const c of [ps, worker]) {
    for (const r of ["cpu", "memory"]) {
      check(c.resources?.requests?.[r] && c.resources?.limits?.[r],
            `${c.name} lacks a ${r} request or limit`);
    }
  }

  // The disruption budget protects dp-ps.
  check(labelsMatch(pdb.spec.selector?.matchLabels,
                    sts.spec.template.metadata.labels),
        "the PodDisruptionBudget does not select dp-ps");

  // Overlay specifics.
  const gpus = worker.resources?.limits?.["nvidia.com/gpu"];
  if (target === "overlays/gpu") {
    check(Number(gpus) === 1, `gpu overlay: nvidia.com/gpu limit ${gpus}`);
    check(wc.backend === "cuda", `gpu overlay: --backend=${wc.backend}`);
  }
  if (target === "overlays/cpu") {
    check(gpus === undefined, "cpu overlay asks for a GPU");
    check(wc.backend === "cpu", `cpu overlay: --backend=${wc.backend}`);
  }

  // Monitoring, where the component is included.
  for (const sm of objects.filter((o) => o.kind === "ServiceMonitor")) {
    check(labelsMatch(sm.spec.selector?.matchLabels, svc.metadata.labels || {}),
          `ServiceMonitor ${sm.metadata.name} does not select the Service`);
    for (const ep of sm.spec.endpoints || []) {
      check(svcPort(ep.port), `ServiceMonitor port ${ep.port} not on the Service`);
    }
  }
  for (const pm of objects.filter((o) => o.kind === "PodMonitor")) {
    check(labelsMatch(pm.spec.selector?.matchLabels,
                      job.spec.template.metadata.labels),
          `PodMonitor ${pm.metadata.name} does not select the workers`);
    for (const ep of pm.spec.podMetricsEndpoints || []) {
      check(containerPort(worker, ep.port),
            `PodMonitor port ${ep.port} is not a worker port`);
    }
  }
  for (const cm of objects.filter(
           (o) => o.kind === "ConfigMap" &&
                  o.metadata.labels?.grafana_dashboard === "1")) {
    for (const [key, text] of Object.entries(cm.data || {})) {
      try {
        const d = JSON.parse(text);
        check(d.title && Array.isArray(d.panels),
              `dashboard ${key} has no title or panels`);
      } catch (e) {
        errors.push(`dashboard ${key} is not JSON: ${e.message}`);
      }
    }
  }
  return errors;
}

// ---------------------------------------------------------------- main

let passed = 0;
let failed = 0;
function report(name, errors) {
  if (errors.length === 0) {
    passed++;
    console.log(`ok    ${name}`);
  } else {
    failed++;
    console.log(`FAIL  ${name}`);
    for (const e of errors) console.log(`        ${e.split("\n").join("\n        ")}`);
  }
}

// Broken copies of a rendered overlay that the checks must reject.
const MUTATIONS = {
  "unknown field in a container": (objs) => {
    find(objs, "Job", "dp-worker").spec.template.spec.containers[0].imagePullPolicyy = "Always";
  },
  "wrong type (completions as a string)": (objs) => {
    find(objs, "Job", "dp-worker").spec.completions = "2";
  },
  "probe on another port": (objs) => {
    find(objs, "StatefulSet", "dp-ps").spec.template.spec.containers[0].readinessProbe.grpc.port = 5002;
  },
  "DP_* variable no flag reads": (objs) => {
    objs.find((o) => o.kind === "ConfigMap" && o.metadata.name.startsWith("dp-ps-config")).data.DP_EPOCH = "3";
  },
  "worker count differs from completions": (objs) => {
    find(objs, "Job", "dp-worker").spec.parallelism = 3;
  },
  "invalid flag value": (objs) => {
    objs.find((o) => o.kind === "ConfigMap" && o.metadata.name.startsWith("dp-worker-config")).data.DP_BACKEND = "tpu";
  },
  "worker pointed at another host": (objs) => {
    objs.find((o) => o.kind === "ConfigMap" && o.metadata.name.startsWith("dp-worker-config")).data.DP_PS = "parameter-server:5000";
  },
  "unknown container argument": (objs) => {
    find(objs, "StatefulSet", "dp-ps").spec.template.spec.containers[0].args = ["--bogus=1"];
  },
  "missing FailJob rule": (objs) => {
    find(objs, "Job", "dp-worker").spec.podFailurePolicy.rules.shift();
  },
};

function main() {
  const bins = parseArgs(process.argv.slice(2));
  const rendered = {};
  for (const target of TARGETS) {
    try {
      rendered[target] = render(target);
      report(`kubectl kustomize ${target} (${rendered[target].length} objects)`, []);
    } catch (e) {
      const hint = e.code === "ENOENT"
          ? " (kubectl >= 1.21 is needed; it is not a Debian 12 package)" : "";
      report(`kubectl kustomize ${target}`, [String(e.stderr || e.message) + hint]);
    }
  }
  const all = [];
  for (const [target, objects] of Object.entries(rendered)) {
    const errors = [];
    for (const obj of objects) {
      const label = `${target}: ${obj.kind}/${obj.metadata?.name}`;
      all.push({label, obj});
      for (const e of schemaErrors(obj)) errors.push(`${label}: ${e}`);
    }
    report(`schemas: ${target}`, errors);
  }
  report("no unknown fields (all targets)", unknownFieldErrors(all));
  for (const [target, objects] of Object.entries(rendered)) {
    report(`drift: ${target} against dp-ps/dp-worker --dry_run`,
           driftErrors(objects, bins, target));
  }

  // The dashboard shipped by the monitoring component is the project's.
  const dashErrors = [];
  if (fs.readFileSync(GRAFANA_DASHBOARD, "utf8") !==
      fs.readFileSync(COMPONENT_DASHBOARD, "utf8")) {
    dashErrors.push(`${path.relative(REPO, COMPONENT_DASHBOARD)} differs ` +
                    `from ${path.relative(REPO, GRAFANA_DASHBOARD)}: copy it`);
  }
  report("dashboard of components/monitoring is deploy/grafana's", dashErrors);

  // Self-test: every check above can fail. A mutation must add an error
  // that the intact overlay does not have.
  if (rendered["overlays/gpu"]) {
    const errorsOf = (objs, strict) => [
      ...objs.flatMap((o) => schemaErrors(o)),
      ...(strict ? unknownFieldErrors(objs.map((obj) => ({label: "gpu", obj})))
                 : []),
      ...driftErrors(objs, bins, "overlays/gpu"),
    ];
    const baseline = new Set(errorsOf(rendered["overlays/gpu"], true));
    for (const [name, mutate] of Object.entries(MUTATIONS)) {
      const objs = JSON.parse(JSON.stringify(rendered["overlays/gpu"]));
      mutate(objs);
      const strict = name.startsWith("unknown field");
      const added = errorsOf(objs, strict).filter((e) => !baseline.has(e));
      report(`self-test: rejects ${name}`,
             added.length > 0 ? [] : ["the broken manifest passed every check"]);
    }
  }

  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main();
