#!/usr/bin/env node
// Offline checks of deploy/k8s, run by ctest (no cluster needed):
//  1. `kubectl kustomize` renders the base and every variant (plain and
//     JobSet; cpu, gpu, TLS, token; another RUN_ID) and the cluster's
//     monitoring;
//  2. every rendered object validates against the schemas of the oldest
//     Kubernetes the manifests support (MIN_KUBERNETES: the kubernetes-types
//     package of that version, through TypeScript: no unknown field, every
//     required one) and of the operators' CRDs (JobSet from
//     schemas/, prometheus-operator and cert-manager from kubernetes-models),
//     and passes kubernetes-models' validation (types, enums, formats);
//  3. drift between the manifests and the binaries: each container's
//     arguments and environment (ConfigMaps and $(VAR) references resolved
//     as the kubelet does) are run through `dp-ps`/`dp-worker --dry_run`,
//     and the ports, probes, Service, NetworkPolicies (together, for a
//     default deny), worker count and parallelism, shard count and
//     addresses ({shard} expanded as the binaries do), run id and the
//     workloads' names,
//     failure policies (per exit code of common/flags.h, per rank, with a
//     deadline), dp-ps's QoS, threads and placement, grace periods,
//     volumes, TLS mounts and certificates, the token's mounts, GPU
//     settings and monitoring objects (release label; rules and dashboard
//     only in the cluster's monitoring) are compared with the effective
//     configuration (dp-ps once per shard);
//  4. a self-test: broken copies of the manifests must fail the checks.
//
// Usage: node check-manifests.js --dp-ps BIN --dp-worker BIN
// Exit status 0 when every check passes.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync, spawnSync } = require("child_process");
const YAML = require("yaml");
const { ruleGroups } = require("./render-prometheus-rule.js");

const HERE = __dirname;
const REPO = path.resolve(HERE, "../..");
const K8S = path.join(REPO, "deploy/k8s");
// The oldest Kubernetes the manifests are for (docs/deploying.md, "Deploy on
// Kubernetes"); its API is the kubernetes-types package of that version.
const MIN_KUBERNETES = "1.29";
// Rendered variants: a kustomize directory, or a kustomization written for
// the test (the JobSet variant with TLS, the token, and a sharded job, which
// no overlay ships).
const TARGETS = {
  // The cluster's monitoring, applied once (no workloads: checked by
  // monitoringErrors instead of the drift checks).
  "monitoring": "monitoring",
  "base": "base",
  "overlays/cpu": "overlays/cpu",
  "overlays/gpu": "overlays/gpu",
  "overlays/tls": "overlays/tls",
  "jobset": "jobset",
  "overlays/jobset": "overlays/jobset",
  "overlays/jobset + tls": {
    resources: ["overlays/jobset"],
    components: ["components/tls", "components/cert-manager", "components/workers"],
  },
  // The token (components/auth-token), with mTLS as docs/security.md
  // advises, and in the JobSet without TLS (its own fsGroup).
  "overlays/tls + token": {
    resources: ["overlays/tls"],
    components: ["components/auth-token"],
  },
  "overlays/jobset + token": {
    resources: ["overlays/jobset"],
    components: ["components/auth-token"],
  },
  // A new run from an overlay (RUN_ID merged, then components/workers
  // again): its Job is named after it, with no second suffix.
  "overlays/gpu, run-2": {
    resources: ["overlays/gpu"],
    configMapGenerator: [{name: "dp-run", behavior: "merge", literals: ["RUN_ID=run-2"]}],
    components: ["components/workers"],
  },
  "overlays/jobset, run-2": {
    resources: ["overlays/jobset"],
    configMapGenerator: [{name: "dp-run", behavior: "merge", literals: ["RUN_ID=run-2"]}],
    components: ["components/workers"],
  },
  // S = 3 as docs/deploying.md tells: DP_SHARDS alone (DP_SHARD_ADDRESSES
  // names the pods by {shard}), then the component that copies S (the shipped
  // overlays run one shard).
  "overlays/tls, 3 shards": {
    resources: ["overlays/tls"],
    configMapGenerator: [{
      name: "dp-ps-config",
      behavior: "merge",
      literals: ["DP_SHARDS=3"],
    }],
    components: ["components/workers"],
  },
};
const GRAFANA_DASHBOARD = path.join(REPO, "deploy/grafana/dashboards/dp-ps.json");
const JOBSET_CRD = path.join(HERE, "schemas/jobset.x-k8s.io_jobsets.yaml");
// The component that copies DP_SHARDS into the StatefulSet's replicas.
const WORKERS_COMPONENT = path.join(K8S, "components/workers/kustomization.yaml");
// The binaries' exit codes, read from common/flags.h where they are
// defined, for the Jobs' podFailurePolicy.
const EXIT = (() => {
  const text = fs.readFileSync(path.join(REPO, "common/flags.h"), "utf8");
  const code = (name) => {
    const m = new RegExp(`\\b${name} =\\s*(\\d+);`).exec(text);
    if (!m) throw new Error(`common/flags.h defines no ${name}`);
    return Number(m[1]);
  };
  return {
    config: code("kExitConfigError"),            // FailJob
    interrupted: code("kExitInterrupted"),       // Ignore (SIGTERM: scaled down)
    psUnreachable: code("kExitPsUnreachable"),   // Ignore (an outage)
    cannotRunHere: code("kExitCannotRunHere"),   // Count, per rank
  };
})();
// The `release` label of the monitoring objects, the one setting of
// monitoring/ and components/monitoring (kube-prometheus-stack selects by
// it).
const RELEASE_LABEL = path.join(K8S, "monitoring/release/release-label.yaml");
// The workloads' names before the run id (components/workers appends it).
const WORKLOAD_NAMES = {plain: "dp-worker", jobset: "dp-train"};
// The label whose value the monitors make the series' job label.
const JOB_LABEL = "app.kubernetes.io/name";

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
  let dir = typeof target === "string" ? path.join(K8S, target) : undefined;
  let tmp;
  if (!dir) {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "dp-kustomize-"));
    const rel = (p) => path.relative(tmp, path.join(K8S, p));
    fs.writeFileSync(path.join(tmp, "kustomization.yaml"), YAML.stringify({
      apiVersion: "kustomize.config.k8s.io/v1beta1",
      kind: "Kustomization",
      resources: target.resources.map(rel),
      ...(target.configMapGenerator ? {configMapGenerator: target.configMapGenerator} : {}),
      components: target.components.map(rel),
    }));
    dir = tmp;
  }
  try {
    const out = execFileSync("kubectl", ["kustomize", dir],
                             {encoding: "utf8", stdio: ["ignore", "pipe", "pipe"]});
    return YAML.parseAllDocuments(out).map((d) => d.toJS()).filter(Boolean);
  } finally {
    if (tmp) fs.rmSync(tmp, {recursive: true, force: true});
  }
}

// ---------------------------------------------------------------- schemas

// kubernetes-models module for an apiVersion (runtime validation).
function modelModule(apiVersion) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
  }
  if (apiVersion === "cert-manager.io/v1") {
    return "@kubernetes-models/cert-manager/cert-manager.io/v1";
  }
  return `kubernetes-models/${apiVersion}`;
}

// The TypeScript type an object must satisfy: Kubernetes' own kinds from
// kubernetes-types (the API of MIN_KUBERNETES), the operators' from
// kubernetes-models. null for JobSet (checked against its CRD).
function typeImport(obj) {
  const k8s = {
    "v1": "core/v1", "apps/v1": "apps/v1", "batch/v1": "batch/v1",
    "networking.k8s.io/v1": "networking/v1", "policy/v1": "policy/v1",
  }[obj.apiVersion];
  if (k8s) return {module: `kubernetes-types/${k8s}`, type: obj.kind};
  if (obj.apiVersion.startsWith("jobset.x-k8s.io/")) return null;
  return {module: `${modelModule(obj.apiVersion)}/${obj.kind}`, type: `I${obj.kind}`};
}

// The pods of a JobSet as batch/v1 Jobs, so that they are checked as
// Kubernetes checks the Jobs the JobSet controller creates.
function jobsOfJobSet(obj) {
  return (obj.spec?.replicatedJobs || []).map((rj) => ({
    apiVersion: "batch/v1",
    kind: "Job",
    metadata: {...(rj.template?.metadata || {}), name: `${obj.metadata.name}-${rj.name}`},
    spec: rj.template?.spec,
  }));
}

let jobsetValidator;
// The JobSet CRD's openAPIV3Schema as an ajv validator that, like the API
// server's pruning, refuses fields the schema does not declare.
function jobsetValidate() {
  if (jobsetValidator) return jobsetValidator;
  const Ajv = require("ajv");
  const crd = YAML.parse(fs.readFileSync(JOBSET_CRD, "utf8"));
  const version = crd.spec.versions.find((v) => v.name === "v1alpha2");
  const closed = (s) => {
    if (Array.isArray(s)) return s.map(closed);
    if (!s || typeof s !== "object") return s;
    const out = {};
    for (const [k, v] of Object.entries(s)) {
      if (k.startsWith("x-kubernetes-")) continue;
      out[k] = k === "properties"
          ? Object.fromEntries(Object.entries(v).map(([p, q]) => [p, closed(q)]))
          : closed(v);
    }
    if (s.properties && s.additionalProperties === undefined &&
        !s["x-kubernetes-preserve-unknown-fields"]) {
      out.additionalProperties = false;
    }
    // int-or-string fields: either is fine.
    if (s["x-kubernetes-int-or-string"]) {
      delete out.type;
      out.anyOf = [{type: "integer"}, {type: "string"}];
    }
    return out;
  };
  const schema = closed(version.schema.openAPIV3Schema);
  // apiVersion, kind and metadata are the API server's, not the CRD's.
  schema.properties.metadata = {type: "object"};
  const ajv = new Ajv({strict: false, allErrors: true, validateFormats: false});
  jobsetValidator = ajv.compile(schema);
  return jobsetValidator;
}

// Errors of the runtime validation of `obj` (types, required fields,
// enums, formats; for a JobSet, its CRD and its Jobs).
function schemaErrors(obj) {
  if (obj.apiVersion === "jobset.x-k8s.io/v1alpha2" && obj.kind === "JobSet") {
    const validate = jobsetValidate();
    const errors = validate(obj) ? [] : validate.errors.map(
        (e) => `JobSet CRD: ${e.instancePath} ${e.message}` +
               (e.params?.additionalProperty ? ` (${e.params.additionalProperty})` : ""));
    for (const job of jobsOfJobSet(obj)) errors.push(...schemaErrors(job));
    return errors;
  }
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

// Resource quantities may be numbers in YAML; the API types them as
// strings.
function quantitiesAsStrings(obj) {
  return JSON.parse(JSON.stringify(obj), function(key, value) {
    if ((key === "requests" || key === "limits") && value && typeof value === "object" &&
        !Array.isArray(value)) {
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, String(v)]));
    }
    if (key === "sizeLimit" || key === "storage") return String(value);
    return value;
  });
}

// Fields that the schemas do not know and required fields that are
// missing, found by TypeScript: each object is a literal assigned to its
// type, so an unknown field anywhere in it is an excess-property error.
// `objects` is [{label, obj}]; a JobSet is checked as its Jobs.
function unknownFieldErrors(objects) {
  const ts = require("typescript");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "dp-manifests-"));
  const file = path.join(dir, "objects.ts");
  const lines = [];
  const labels = [];
  const add = (label, obj) => {
    const t = typeImport(obj);
    if (!t) return;
    const i = labels.length;
    labels.push(label);
    lines.push(`import type { ${t.type} as T${i} } from "${t.module}";`);
    lines.push(`export const o${i}: T${i} = ${JSON.stringify(quantitiesAsStrings(obj))};`);
  };
  for (const {label, obj} of objects) {
    if (obj.kind === "JobSet") {
      for (const job of jobsOfJobSet(obj)) add(`${label} (${job.metadata.name})`, job);
    } else {
      add(label, obj);
    }
  }
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
    return `${labels[Math.floor(line / 2)] ?? "?"}: ${text}`;
  });
  fs.rmSync(dir, {recursive: true, force: true});
  return errors;
}

// ---------------------------------------------------------------- drift

function find(objects, kind, name) {
  return objects.find((o) => o.kind === kind && (!name || o.metadata.name === name));
}

// The workers' Job (plain variant), by its label: its name carries the run
// id.
function workersJob(objects) {
  return objects.find((o) => o.kind === "Job" &&
                             o.metadata.labels?.["app.kubernetes.io/name"] === "dp-worker");
}

function containerPort(container, name) {
  const p = (container.ports || []).find((q) => q.name === name);
  return p ? p.containerPort : undefined;
}

function configMap(objects, prefix) {
  return objects.find((o) => o.kind === "ConfigMap" && o.metadata.name.startsWith(prefix));
}

// $(VAR) references in an env value, as the kubelet expands them: from the
// variables defined before, "$$" for a literal "$", unknown ones left as
// they are.
function expandEnv(value, env) {
  return value.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, name) => {
    if (m === "$$") return "$";
    return env[name] !== undefined ? env[name] : m;
  });
}

// Runs `binary --dry_run` with the container's arguments and environment,
// as the kubelet would start it: ConfigMaps of envFrom and configMapKeyRef
// resolved from the rendered objects, fieldRef from `fields` (fieldPath ->
// the value on the pod), $(VAR) expanded, JOB_COMPLETION_INDEX set for an
// Indexed Job. Returns {code, config (flag -> value), env, sources, output}:
// sources[name] says where variable `name` came from, {configMap, key},
// {value} or {fieldPath}.
function dryRun(binary, container, objects, extraEnv, fields = {}) {
  const env = {PATH: process.env.PATH, ...extraEnv};
  const sources = {};
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
    for (const key of Object.keys(cm.data || {})) {
      sources[key] = {configMap: cm.metadata.name, key};
    }
  }
  for (const e of container.env || []) {
    const keyRef = e.valueFrom?.configMapKeyRef;
    const fieldRef = e.valueFrom?.fieldRef;
    if (e.value !== undefined) {
      env[e.name] = expandEnv(e.value, env);
      sources[e.name] = {value: e.value};
      if (/\$\(/.test(env[e.name])) {
        problems.push(`env ${e.name}=${e.value} refers to an undefined variable`);
      }
    } else if (keyRef) {
      const value = find(objects, "ConfigMap", keyRef.name)?.data?.[keyRef.key];
      if (value === undefined) {
        problems.push(`env ${e.name}: ConfigMap ${keyRef.name} has no key ${keyRef.key}`);
      } else {
        env[e.name] = value;
        sources[e.name] = {configMap: keyRef.name, key: keyRef.key};
      }
    } else if (fieldRef && fields[fieldRef.fieldPath] !== undefined) {
      env[e.name] = fields[fieldRef.fieldPath];
      sources[e.name] = {fieldPath: fieldRef.fieldPath};
    } else if (fieldRef) {
      problems.push(`env ${e.name}: the pod has no ${fieldRef.fieldPath}`);
    } else {
      problems.push(`env ${e.name} has neither a value nor a ConfigMap key or pod field`);
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
  return {code: r.status, config, env, sources,
          output: (r.stdout || "") + (r.stderr || ""), problems};
}

// JSON with sorted keys: kustomize reorders them.
function canonical(value) {
  return JSON.stringify(value, (k, v) => (v && typeof v === "object" && !Array.isArray(v))
      ? Object.fromEntries(Object.keys(v).sort().map((key) => [key, v[key]])) : v);
}

function labelsMatch(selector, labels) {
  return Object.entries(selector || {}).every(([k, v]) => (labels || {})[k] === v);
}

// The two workloads of a rendered variant, whatever their kind:
// {kind, ps: {pod (template), job (Job spec or null), sts}, worker: {pod,
// job}, jobset}. null when neither shape is there.
function workloads(objects) {
  const sts = find(objects, "StatefulSet", "dp-ps");
  const job = workersJob(objects);
  const jobset = find(objects, "JobSet");
  if (sts && job && !jobset) {
    return {kind: "plain", ps: {pod: sts.spec.template, job: null, sts},
            worker: {pod: job.spec.template, job: job.spec, obj: job}};
  }
  if (jobset && !sts && !job) {
    const rj = (name) => jobset.spec.replicatedJobs.find((r) => r.name === name);
    const ps = rj("ps");
    const workers = rj("workers");
    if (!ps || !workers) return null;
    return {kind: "jobset", jobset,
            ps: {pod: ps.template.spec.template, job: ps.template.spec, rj: ps},
            worker: {pod: workers.template.spec.template, job: workers.template.spec,
                     rj: workers}};
  }
  return null;
}

// The fields a pod of dp-ps's workload has for the downward API: its
// template's labels, and for the StatefulSet's pod K its name and the
// ordinal label the controller adds (Kubernetes 1.28 or newer).
function psPodFields(w, k) {
  const fields = {};
  for (const [key, value] of Object.entries(w.ps.pod.metadata?.labels || {})) {
    fields[`metadata.labels['${key}']`] = value;
  }
  if (w.kind === "plain") {
    fields["metadata.name"] = `${w.ps.sts.metadata.name}-${k}`;
    fields["metadata.labels['apps.kubernetes.io/pod-index']"] = String(k);
  }
  return fields;
}

// "a:1,b:2" as ["a:1", "b:2"].
function addressList(value) {
  return (value || "").split(",").map((a) => a.trim()).filter(Boolean);
}

// The most shards a job may have (common/shard_plan.h kMaxShards).
const MAX_SHARDS = 64;

// The addresses a --ps or --shard_addresses value names, as the binaries
// expand it (common/shard_plan.h ExpandShardTemplate): an entry holding
// "{shard}" stands for `shards` entries, with 0..shards-1 in its place.
// {addresses} or, for a template without a shard count, {error}.
function expandShardTemplate(value, shards) {
  const addresses = [];
  for (const entry of addressList(value)) {
    if (!entry.includes("{shard}")) {
      addresses.push(entry);
      continue;
    }
    if (!(Number.isInteger(shards) && shards >= 1 && shards <= MAX_SHARDS)) {
      return {error: `'${entry}' names each shard by {shard} but the shard count is ` +
                     `${shards}, not in 1..${MAX_SHARDS}`};
    }
    for (let k = 0; k < shards; ++k) addresses.push(entry.split("{shard}").join(String(k)));
  }
  return {addresses};
}

function hostOf(address) {
  return address.slice(0, address.lastIndexOf(":"));
}

let replicasSourceCache;
// Where components/workers takes the StatefulSet's replicas from:
// {configMap (the generator's name, before its hash suffix), key}, or
// undefined when no replacement sets them.
function replicasSource() {
  if (replicasSourceCache !== undefined) return replicasSourceCache || undefined;
  const component = YAML.parse(fs.readFileSync(WORKERS_COMPONENT, "utf8"));
  const r = (component.replacements || []).find((x) =>
      x.source?.kind === "ConfigMap" &&
      /^data\.[A-Za-z_][A-Za-z0-9_]*$/.test(x.source.fieldPath || "") &&
      (x.targets || []).some((t) => t.select?.kind === "StatefulSet" &&
                                    t.select?.name === "dp-ps" &&
                                    (t.fieldPaths || []).includes("spec.replicas")));
  replicasSourceCache = r ? {configMap: r.source.name, key: r.source.fieldPath.slice(5)} : null;
  return replicasSourceCache || undefined;
}

// Whether the rendered ConfigMap `rendered` is generator `name`'s (which
// kustomize suffixes with a hash).
function isGenerated(rendered, name) {
  return rendered === name || (rendered || "").startsWith(`${name}-`);
}

// A source of dryRun's `sources`, in words.
function describeSource(source) {
  if (!source) return "nowhere";
  if (source.configMap) return `ConfigMap ${source.configMap} key ${source.key}`;
  if (source.fieldPath) return `the pod's ${source.fieldPath}`;
  return `the literal '${source.value}'`;
}

// The volume of `pod` mounted in `container` at a path that holds `file`.
function volumeOf(pod, container, file) {
  const mount = (container.volumeMounts || [])
                    .filter((m) => file === m.mountPath || file.startsWith(m.mountPath + "/"))
                    .sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  if (!mount) return undefined;
  return (pod.spec.volumes || []).find((v) => v.name === mount.name) ||
         {name: mount.name, claimTemplate: true};
}

// The Secret key that components/auth-token mounts as the token file
// (docs/deploying.md: kubectl create secret ... --from-file=token=...).
const TOKEN_KEY = "token";

// The checks of the token (--auth_token_file, components/auth-token): when
// dp-ps requires one, every worker sends it, and both read the same key of
// the same Secret, mounted so that only the process's own group can read it
// (0440 with the pod's fsGroup being the container's group: no warning
// from the binaries, which warn about a file that others can read).
function tokenErrors(w, ps, worker, pc, wc) {
  const errors = [];
  const check = (cond, message) => {
    if (!cond) errors.push(message);
  };
  if (!pc.auth_token_file && !wc.auth_token_file) return errors;
  check(pc.auth_token_file, `the workers send a token (--auth_token_file=` +
                            `${wc.auth_token_file}) that dp-ps does not require`);
  check(wc.auth_token_file, `dp-ps requires a token (--auth_token_file=` +
                            `${pc.auth_token_file}) but the workers send none`);
  const secrets = {};
  for (const [who, pod, c, conf] of [["dp-ps", w.ps.pod, ps, pc],
                                     ["dp-worker", w.worker.pod, worker, wc]]) {
    const file = conf.auth_token_file;
    if (!file) continue;
    const v = volumeOf(pod, c, file);
    check(v && v.secret, `${who} --auth_token_file=${file} is not on a Secret volume`);
    if (!v || !v.secret) continue;
    secrets[who] = v.secret.secretName;
    const mount = c.volumeMounts.find((m) => m.name === v.name);
    check(mount.readOnly === true, `${who}: the token's volume is not mounted read-only`);
    const key = path.posix.relative(mount.mountPath, file);
    const items = v.secret.items;
    check(items ? items.some((i) => i.path === key && i.key === TOKEN_KEY) : key === TOKEN_KEY,
          `${who} --auth_token_file=${file} is not key ${TOKEN_KEY} of Secret ` +
          `${v.secret.secretName}`);
    const mode = v.secret.defaultMode ?? 0o644;
    check((mode & 0o007) === 0,
          `${who}: Secret ${v.secret.secretName} (mode ${mode.toString(8)}) is readable by ` +
          "others");
    const group = c.securityContext?.runAsGroup ?? pod.spec.securityContext?.runAsGroup;
    const fsGroup = pod.spec.securityContext?.fsGroup;
    check(fsGroup !== undefined && fsGroup === group && (mode & 0o040),
          `${who}: Secret ${v.secret.secretName} must be readable by the pod's fsGroup ` +
          `(${fsGroup}), the container's group (${group}): set fsGroup, mode 0440 ` +
          "(without it the files are root's, which uid 65532 cannot read)");
  }
  if (secrets["dp-ps"] && secrets["dp-worker"]) {
    check(secrets["dp-ps"] === secrets["dp-worker"],
          `dp-ps reads its token from Secret ${secrets["dp-ps"]}, the workers from another ` +
          `Secret, ${secrets["dp-worker"]}`);
  }
  return errors;
}

// The checks of the failure policy of a Job spec running `container`; for
// the workers' Job (`workers`), also per-rank retries, dp-worker's exit
// codes and the deadline that bounds the retries it does not count.
function failurePolicyErrors(jobSpec, container, who, workers = false) {
  const errors = [];
  const rules = jobSpec.podFailurePolicy?.rules || [];
  const onExit = (action, code) => rules.some(
      (r) => r.action === action && r.onExitCodes?.operator === "In" &&
             r.onExitCodes.values.includes(code) &&
             r.onExitCodes.containerName === container.name);
  if (!onExit("FailJob", EXIT.config)) {
    errors.push(`${who}: no FailJob rule for exit code ${EXIT.config} of ${container.name}`);
  }
  if (!rules.some((r) => r.action === "Ignore" &&
                         (r.onPodConditions || []).some((c) => c.type === "DisruptionTarget"))) {
    errors.push(`${who}: no Ignore rule for DisruptionTarget`);
  }
  if (jobSpec.template.spec.restartPolicy !== "Never") {
    errors.push(`${who}: podFailurePolicy needs restartPolicy Never`);
  }
  if (!(jobSpec.activeDeadlineSeconds > 0)) {
    errors.push(`${who}: no activeDeadlineSeconds: pods that never start (a GPU ` +
                "node's driver too old, an image not pulled) or retried for ever " +
                "would hold their resources with no end");
  }
  if (!workers) return errors;
  if (!onExit("Ignore", EXIT.interrupted)) {
    errors.push(`${who}: exit code ${EXIT.interrupted} (stopped by SIGTERM) must be ` +
                "retried without counting (Ignore): every lower parallelism stops a " +
                "worker, and would use up its rank's retries");
  }
  if (!onExit("Ignore", EXIT.psUnreachable)) {
    errors.push(`${who}: exit code ${EXIT.psUnreachable} (dp-ps unreachable) must be ` +
                "retried without counting (Ignore): a dp-ps outage is no worker's fault");
  }
  if (!onExit("Count", EXIT.cannotRunHere)) {
    errors.push(`${who}: exit code ${EXIT.cannotRunHere} (this node cannot run the ` +
                "backend) must be retried and counted (Count), not fail the Job");
  }
  if (!(jobSpec.backoffLimitPerIndex > 0) || jobSpec.maxFailedIndexes !== 0 ||
      jobSpec.backoffLimit !== undefined) {
    errors.push(`${who}: retries must be per rank (backoffLimitPerIndex, ` +
                "maxFailedIndexes 0, no Job-wide backoffLimit): with a Job-wide " +
                "limit the failures of all ranks add up");
  }
  return errors;
}

// Whether a label selector (matchLabels, matchExpressions with In / NotIn /
// Exists / DoesNotExist) selects `labels`.
function selectorMatches(selector, labels) {
  if (!selector) return false;
  const l = labels || {};
  return labelsMatch(selector.matchLabels, l) &&
         (selector.matchExpressions || []).every((e) => ({
           In: () => (e.values || []).includes(l[e.key]),
           NotIn: () => !(e.values || []).includes(l[e.key]),
           Exists: () => e.key in l,
           DoesNotExist: () => !(e.key in l),
         }[e.operator] || (() => false))());
}

// Whether a NetworkPolicy ingress rule's port list admits the named port
// (number `number`) of the pod.
function rulePortAdmits(rule, name, number) {
  if (!rule.ports || rule.ports.length === 0) return true;
  return rule.ports.some((p) => p.port === undefined || p.port === name || p.port === number);
}

// The drift checks of one rendered variant; returns a list of errors.
function driftErrors(objects, bins, target) {
  const errors = [];
  const check = (cond, message) => {
    if (!cond) errors.push(message);
  };

  const w = workloads(objects);
  const svc = find(objects, "Service", "dp-ps");
  if (!w || !svc) {
    return ["expected Service dp-ps and either StatefulSet dp-ps + Job dp-worker or " +
            "a JobSet with replicated jobs ps and workers"];
  }
  const ps = w.ps.pod.spec.containers.find((c) => c.name === "dp-ps");
  const worker = w.worker.pod.spec.containers.find((c) => c.name === "dp-worker");
  if (!ps || !worker) return ["expected containers dp-ps and dp-worker"];
  check(w.ps.pod.spec.containers.length === 1 && w.worker.pod.spec.containers.length === 1,
        "one container per pod (the binaries are checked by container name)");
  check(/(^|\/)dp-ps(:|@)/.test(ps.image), `dp-ps image ${ps.image} has no tag`);
  check(/(^|\/)dp-worker(:|@)/.test(worker.image),
        `dp-worker image ${worker.image} has no tag`);

  // Every argument and DP_* variable is accepted by the binary (dp-ps as
  // shard 0 here; every shard below).
  const psRun = dryRun(bins["dp-ps"], ps, objects, {}, psPodFields(w, 0));
  const wRun = dryRun(bins["dp-worker"], worker, objects, {JOB_COMPLETION_INDEX: "0"});
  for (const [name, run] of [["dp-ps", psRun], ["dp-worker", wRun]]) {
    for (const p of run.problems) errors.push(`${name}: ${p}`);
    check(run.code === 0,
          `${name} --dry_run with the manifest's configuration exited ` +
          `${run.code}:\n${run.output}`);
  }
  if (psRun.code !== 0 || wRun.code !== 0) return errors;
  const pc = psRun.config;
  const wc = wRun.config;

  // dp-ps: ports, Service, probes on the plaintext health port.
  const grpcPort = Number(pc.port);
  const healthPort = Number(pc.health_port);
  check(containerPort(ps, "grpc") === grpcPort,
        `dp-ps containerPort grpc ${containerPort(ps, "grpc")} != --port ${pc.port}`);
  check(healthPort > 0 && healthPort !== grpcPort &&
            containerPort(ps, "health") === healthPort,
        `dp-ps containerPort health ${containerPort(ps, "health")} != --health_port ` +
        `${pc.health_port} (a port of its own, for the probes)`);
  const metricsPort = Number(pc.metrics_port);
  check(metricsPort > 0 && containerPort(ps, "metrics") === metricsPort,
        `dp-ps containerPort metrics ${containerPort(ps, "metrics")} != ` +
        `--metrics_port ${pc.metrics_port}`);
  check(pc.host === "0.0.0.0" || pc.host === "::",
        `dp-ps --host=${pc.host} is not reachable from other pods`);
  check(svc.spec.clusterIP === "None", "the dp-ps Service is not headless");
  check(svc.spec.publishNotReadyAddresses === true,
        "the dp-ps Service must publish not-ready addresses, so that a shard's " +
        "name resolves while it starts (publishNotReadyAddresses)");
  check(labelsMatch(svc.spec.selector, w.ps.pod.metadata.labels),
        "the Service does not select the dp-ps pod");
  check(!labelsMatch(svc.spec.selector, w.worker.pod.metadata.labels),
        "the Service selects the workers too");
  const svcPort = (name) => (svc.spec.ports || []).find((p) => p.name === name);
  for (const name of ["grpc", "metrics"]) {
    const p = svcPort(name);
    check(p, `Service has no port named ${name}`);
    if (!p) continue;
    const t = typeof p.targetPort === "string"
        ? containerPort(ps, p.targetPort) : (p.targetPort ?? p.port);
    check(t === containerPort(ps, name),
          `Service port ${name} targets ${p.targetPort}, not the container's ${name} port`);
  }
  // The kubelet's gRPC probes speak no TLS: they must use the health port,
  // which serves grpc.health.v1 in plaintext whatever --port uses.
  for (const kind of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const probe = ps[kind];
    check(probe && probe.grpc, `dp-ps has no grpc ${kind}`);
    if (!probe || !probe.grpc) continue;
    check(probe.grpc.port === healthPort,
          `dp-ps ${kind} port ${probe.grpc.port} != --health_port ${healthPort}`);
    const service = probe.grpc.service || "";
    // proto/grpc_server.h: readiness is "", liveness is "liveness".
    check(service === (kind === "livenessProbe" ? "liveness" : ""),
          `dp-ps ${kind} checks service '${service}'`);
  }

  // The run's identity: checkpoints and model under RUN_ID, on the state
  // volume, which outlives the workloads.
  const runId = psRun.env.RUN_ID;
  // In the workloads' names too, under the limits of a JobSet's and an
  // Indexed Job's pod host names (a DNS label of 63 characters).
  check(/^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$/.test(runId || ""),
        `RUN_ID '${runId}' must be 1 to 32 lowercase letters, digits and '-', ` +
        "starting and ending with a letter or digit");
  // A Job's pod template and a JobSet's replicatedJobs are immutable: a new
  // run must be a new object, or `kubectl apply` leaves the finished one.
  const workload = w.kind === "plain" ? w.worker.obj : w.jobset;
  const wantName = `${WORKLOAD_NAMES[w.kind]}-${runId}`;
  check(workload.metadata.name === wantName,
        `the ${workload.kind} is named ${workload.metadata.name}, not ${wantName}: ` +
        "without the run id a new RUN_ID applies over the finished one");
  check(pc.checkpoint_dir && path.posix.basename(pc.checkpoint_dir) === runId,
        `dp-ps --checkpoint_dir=${pc.checkpoint_dir} is not the run's (RUN_ID ${runId})`);
  check(pc.save_model && path.posix.basename(pc.save_model).startsWith(`${runId}.`),
        `dp-ps --save_model=${pc.save_model} is not the run's (RUN_ID ${runId})`);
  for (const flag of ["save_model", "checkpoint_dir"]) {
    const v = volumeOf(w.ps.pod, ps, pc[flag] || "");
    const persistent = v && (v.claimTemplate || v.persistentVolumeClaim);
    check(persistent, `dp-ps --${flag}=${pc[flag]} is not on the state volume`);
    if (v && v.claimTemplate) {
      check((w.ps.sts.spec.volumeClaimTemplates || []).some((t) => t.metadata.name === v.name),
            `dp-ps volume ${v.name} has no claim template`);
    }
    if (v && v.persistentVolumeClaim) {
      check(find(objects, "PersistentVolumeClaim", v.persistentVolumeClaim.claimName),
            `PersistentVolumeClaim ${v.persistentVolumeClaim.claimName} is not rendered`);
    }
  }
  // dp-ps writes only to mounted volumes (the root filesystem is read-only).
  check(ps.securityContext?.readOnlyRootFilesystem === true &&
            worker.securityContext?.readOnlyRootFilesystem === true,
        "root filesystems must be read-only");

  // Shards: one pod each, which knows its index, and every shard's stable
  // DNS name under the headless Service in dp-ps's --shard_addresses
  // (shard 0 collects the model from them) and in the workers' --ps.
  const shards = Number(pc.shards);
  if (w.kind === "plain") {
    check(w.ps.sts.spec.replicas === shards,
          `StatefulSet replicas ${w.ps.sts.spec.replicas} != dp-ps --shards ${pc.shards} ` +
          "(one pod per shard; components/workers copies DP_SHARDS)");
    check(w.ps.sts.spec.podManagementPolicy === "Parallel",
          "the shards must start together (podManagementPolicy Parallel), not each " +
          "after the one before is ready");
    check(shards === 1 ? ["-1", "0"].includes(pc.shard) : pc.shard === "0",
          `dp-ps pod 0 runs as --shard=${pc.shard}`);
    for (let k = 1; k < shards; ++k) {
      const run = dryRun(bins["dp-ps"], ps, objects, {}, psPodFields(w, k));
      check(run.code === 0 && run.config.shard === String(k),
            `dp-ps pod ${k} runs as --shard=${run.config.shard} (exit ${run.code}), ` +
            `not ${k}: DP_SHARD must come from the pod's index\n${run.output}`);
    }
  } else {
    check(shards === 1,
          `the JobSet runs one dp-ps shard, not --shards=${pc.shards}: a shard needs a ` +
          "volume of its own that outlives its pod, which a Job's pods cannot each " +
          "have; shard dp-ps with the plain variant");
    check(w.ps.pod.spec.hostname && w.ps.pod.spec.subdomain === svc.metadata.name,
          "the JobSet's dp-ps pod needs a hostname and the Service as its subdomain, " +
          "for a stable DNS name");
  }
  const grpcServicePort = (svc.spec.ports || []).find((p) => p.name === "grpc")?.port;
  const shardNames = w.kind === "plain"
      ? Array.from({length: shards}, (_, k) =>
            `${w.ps.sts.metadata.name}-${k}.${w.ps.sts.spec.serviceName}:${grpcServicePort}`)
      : [`${w.ps.pod.spec.hostname}.${w.ps.pod.spec.subdomain}:${grpcServicePort}`];
  const sameSet = (a, b) => a.length === b.length && [...a].sort().join() === [...b].sort().join();
  // What each binary dials, its {shard} entries expanded with its own
  // --shards (the workers' must be dp-ps's S for them to agree).
  const shardAddresses = expandShardTemplate(pc.shard_addresses, shards);
  const workerAddresses = expandShardTemplate(wc.ps, Number(wc.shards));
  check(!shardAddresses.error, `dp-ps --shard_addresses: ${shardAddresses.error}`);
  check(!workerAddresses.error, `worker --ps: ${workerAddresses.error}`);
  check(sameSet(shardAddresses.addresses || [], shardNames),
        `dp-ps --shard_addresses=${pc.shard_addresses} (--shards=${pc.shards}) names ` +
        `${(shardAddresses.addresses || []).join(",")}, not exactly the ` +
        `${shardNames.length} shard pod(s) ${shardNames.join(",")}`);
  check(sameSet(workerAddresses.addresses || [], shardNames),
        `worker --ps=${wc.ps} (--shards=${wc.shards}) names ` +
        `${(workerAddresses.addresses || []).join(",")}, not exactly the shard pod(s) ` +
        `${shardNames.join(",")}`);
  // S is written once: dp-ps and the workers read DP_SHARDS from the
  // ConfigMap key that components/workers copies into the StatefulSet's
  // replicas, so a new S changes all three (a copy of S elsewhere would
  // pass here and drift at the next change).
  const src = replicasSource();
  const fromReplicasSource = (s) => Boolean(src && s?.configMap &&
      isGenerated(s.configMap, src.configMap) && s.key === src.key);
  check(src, `${path.relative(REPO, WORKERS_COMPONENT)} does not copy a ConfigMap key ` +
             "into the dp-ps StatefulSet's spec.replicas");
  if (src) {
    const where = `ConfigMap ${src.configMap} key ${src.key}, which components/workers ` +
                  "copies into the StatefulSet's replicas";
    check(fromReplicasSource(psRun.sources.DP_SHARDS),
          `dp-ps gets DP_SHARDS from ${describeSource(psRun.sources.DP_SHARDS)}, ` +
          `not from ${where}`);
    check(fromReplicasSource(wRun.sources.DP_SHARDS),
          `the workers get DP_SHARDS from ${describeSource(wRun.sources.DP_SHARDS)}, ` +
          `not from ${where} (their --ps's {shard} entry stands for --shards pods)`);
  }
  check(Number(wc.shards) === shards,
        `worker --shards=${wc.shards} != dp-ps --shards=${pc.shards}`);

  // The workload's lifecycle.
  if (w.kind === "plain") {
    check(w.ps.sts.spec.serviceName === svc.metadata.name,
          "StatefulSet serviceName is not the Service");
    check(pc.exit_when_done === "false",
          "dp-ps must keep running after training (--exit_when_done=false): " +
          "a StatefulSet restarts a container that exits");
  } else {
    check(pc.exit_when_done === "true",
          "in a JobSet dp-ps must exit when training is done (--exit_when_done=true)");
    const js = w.jobset.spec;
    check(js.replicatedJobs[0].name === "ps", "the first replicated job must be ps");
    check((w.ps.rj.replicas ?? 1) === 1 && w.ps.job.completions === 1 &&
              w.ps.job.parallelism === 1,
          "replicated job ps must run exactly one pod");
    check((w.worker.rj.replicas ?? 1) === 1, "replicated job workers must have 1 replica");
    const startsAfterPs = (w.worker.rj.dependsOn || []).some(
        (d) => d.name === "ps" && d.status === "Ready") ||
        js.startupPolicy?.startupPolicyOrder === "InOrder";
    check(startsAfterPs, "the workers must start once dp-ps is ready (dependsOn ps Ready)");
    check(js.successPolicy?.operator === "All" &&
              JSON.stringify(js.successPolicy.targetReplicatedJobs) === '["workers"]',
          "the JobSet must succeed when the workers succeed (successPolicy All workers)");
    const failRules = js.failurePolicy?.rules || [];
    check(failRules.some((r) => r.action === "FailJobSet" &&
                                (r.targetReplicatedJobs || []).includes("ps")),
          "the JobSet must fail when dp-ps fails (FailJobSet for ps)");
    errors.push(...failurePolicyErrors(w.ps.job, ps, "dp-ps Job"));
  }
  // No budget may block node drains: dp-ps checkpoints on SIGTERM and the
  // workers retry, and once the job is done nothing needs protecting.
  for (const pdb of objects.filter((o) => o.kind === "PodDisruptionBudget")) {
    const blocks = pdb.spec.maxUnavailable === 0 || pdb.spec.maxUnavailable === "0%" ||
                   (pdb.spec.minAvailable !== undefined && pdb.spec.minAvailable !== 0);
    check(!(blocks && labelsMatch(pdb.spec.selector?.matchLabels, w.ps.pod.metadata.labels)),
          `PodDisruptionBudget ${pdb.metadata.name} blocks the eviction of dp-ps ` +
          "(node drains would wait for ever)");
  }

  // Workers: the rank, the count (their addresses of dp-ps: above). One
  // completion index per rank, --workers of them (the most at once); the
  // parallelism, how many run now, may change while the Job runs, and
  // steps go on while at least --min_workers do.
  check(wc.rank === "0", `worker rank from JOB_COMPLETION_INDEX: ${wc.rank}`);
  check(w.worker.job.completionMode === "Indexed", "the workers' Job is not Indexed");
  check(w.worker.job.completions === Number(pc.workers),
        `workers' completions ${w.worker.job.completions} != dp-ps --workers ` +
        `${pc.workers} (one completion index per rank)`);
  const parallelism = w.worker.job.parallelism;
  check(Number.isInteger(parallelism) && parallelism >= Number(pc.min_workers) &&
            parallelism <= w.worker.job.completions,
        `workers' parallelism ${parallelism} is not in dp-ps --min_workers ` +
        `${pc.min_workers} .. completions ${w.worker.job.completions}: ` +
        (parallelism > w.worker.job.completions
             ? "no more pods than ranks run" : "the steps would wait"));
  errors.push(...failurePolicyErrors(w.worker.job, worker, "workers' Job", true));
  // N may change for the same run (elastic.md) only while the job does not
  // depend on it: the default global batch is --batch_size x --workers, and
  // dp-ps refuses a checkpoint of another global batch (exit 2).
  check(Number(pc.global_batch) > 0,
        `dp-ps --global_batch=${pc.global_batch}: set DP_GLOBAL_BATCH, or the global ` +
        "batch is --batch_size x --workers and a new DP_WORKERS for the same RUN_ID " +
        "makes dp-ps refuse the run's checkpoint (exit 2, a crash loop)");

  // Worker probes and ports.
  const wHealth = Number(wc.health_port);
  check(wHealth > 0 && containerPort(worker, "health") === wHealth,
        `worker containerPort health ${containerPort(worker, "health")} != ` +
        `--health_port ${wc.health_port}`);
  for (const kind of ["startupProbe", "readinessProbe"]) {
    const probe = worker[kind];
    check(probe && probe.grpc && probe.grpc.port === wHealth,
          `worker ${kind} is not a grpc probe on --health_port ${wHealth}`);
  }
  check(!worker.livenessProbe || worker.livenessProbe.grpc?.service === "liveness",
        "a worker liveness probe must check the 'liveness' service");
  if (Number(wc.metrics_port) > 0) {
    check(containerPort(worker, "metrics") === Number(wc.metrics_port),
          `worker containerPort metrics != --metrics_port ${wc.metrics_port}`);
  }

  // Grace periods cover the stops.
  const workerGrace = w.worker.pod.spec.terminationGracePeriodSeconds;
  check(workerGrace > Number(wc.stop_timeout_s),
        `worker terminationGracePeriodSeconds ${workerGrace} <= ` +
        `--stop_timeout_s ${wc.stop_timeout_s}`);
  const psGrace = w.ps.pod.spec.terminationGracePeriodSeconds;
  // dp-ps: the drain hook (a checkpoint) plus 2 s of gRPC shutdown.
  check(psGrace >= 30, `dp-ps terminationGracePeriodSeconds ${psGrace} < 30`);

  // Requests and limits everywhere.
  for (const c of [ps, worker]) {
    for (const r of ["cpu", "memory"]) {
      check(c.resources?.requests?.[r] && c.resources?.limits?.[r],
            `${c.name} lacks a ${r} request or limit`);
    }
  }
  // dp-ps: Guaranteed QoS (evicted last under node pressure) except on the
  // laptop-sized cpu overlay, its update threads within its CPU limit, no
  // shared memory (no worker shares its pod), no move by consolidation, and
  // shards spread over nodes.
  if (target !== "overlays/cpu") {
    for (const r of ["cpu", "memory"]) {
      check(String(ps.resources?.requests?.[r]) === String(ps.resources?.limits?.[r]),
            `dp-ps's ${r} request ${ps.resources?.requests?.[r]} != its limit ` +
            `${ps.resources?.limits?.[r]}: not Guaranteed QoS, evicted early`);
    }
  }
  const cpuLimit = ((q) => /m$/.test(q) ? Number(q.slice(0, -1)) / 1000 : Number(q))(
      String(ps.resources?.limits?.cpu));
  check(Number(pc.update_threads) >= 1 && Number(pc.update_threads) <= Math.ceil(cpuLimit),
        `dp-ps --update_threads=${pc.update_threads} is not 1..its CPU limit ` +
        `${ps.resources?.limits?.cpu} (0 takes the node's core count: throttled)`);
  check(pc.shared_memory === "false",
        "dp-ps --shared_memory must be false: no worker shares its pod");
  const podAnnotations = w.ps.pod.metadata.annotations || {};
  check(podAnnotations["karpenter.sh/do-not-disrupt"] === "true" &&
            podAnnotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] === "false",
        "dp-ps pods lack the autoscalers' do-not-disrupt annotations");
  const spread = (w.ps.pod.spec.affinity?.podAntiAffinity
                      ?.preferredDuringSchedulingIgnoredDuringExecution || [])
                     .some((t) => t.podAffinityTerm?.topologyKey === "kubernetes.io/hostname" &&
                                  labelsMatch(t.podAffinityTerm.labelSelector?.matchLabels,
                                              w.ps.pod.metadata.labels));
  check(spread, "dp-ps's shards are not spread over nodes (preferred anti-affinity " +
                "on kubernetes.io/hostname)");
  for (const [who, pod] of [["dp-ps", w.ps.pod], ["dp-worker", w.worker.pod]]) {
    check(pod.spec.automountServiceAccountToken === false,
          `${who} pods mount a service account token they never use`);
  }

  // NetworkPolicies, for a namespace that denies everything by default
  // (they add up: a pod may do what any policy selecting it admits):
  // dp-ps's gRPC port only from the workers and, with several shards, from
  // dp-ps's pods (shard 0 collects the model); both roles' metrics ports
  // from the scraper, chosen in one place; out, DNS and dp-ps's gRPC port.
  const psLabels = w.ps.pod.metadata.labels;
  const wLabels = w.worker.pod.metadata.labels;
  const selecting = (labels) => objects.filter(
      (o) => o.kind === "NetworkPolicy" && selectorMatches(o.spec.podSelector, labels));
  const psPolicies = selecting(psLabels);
  const wPolicies = selecting(wLabels);
  check(psPolicies.length > 0, "no NetworkPolicy selects dp-ps");
  check(wPolicies.length > 0, "no NetworkPolicy selects the workers");
  // A same-namespace pod peer that selects `labels`.
  const peerIs = (f, labels) => !f.namespaceSelector && !f.ipBlock && f.podSelector &&
                                selectorMatches(f.podSelector, labels);
  const ingressOf = (pols) => pols.flatMap((np) => np.spec.ingress || []);
  const egressOf = (pols) => pols.flatMap((np) => np.spec.egress || []);
  for (const [who, pols] of [["dp-ps", psPolicies], ["the workers", wPolicies]]) {
    for (const type of ["Ingress", "Egress"]) {
      check(pols.some((np) => (np.spec.policyTypes || []).includes(type)),
            `no NetworkPolicy restricts the ${type.toLowerCase()} of ${who}`);
    }
    // Egress: DNS, and dp-ps's gRPC port.
    const egress = egressOf(pols);
    check(egress.some((r) => (!r.to || r.to.length === 0 ||
                              r.to.some((t) => t.namespaceSelector)) &&
                             (r.ports || []).some((p) => p.port === 53 &&
                                                         (p.protocol || "TCP") === "UDP")),
          `the NetworkPolicies do not let ${who} reach DNS (port 53 UDP)`);
    if (who === "the workers" || shards > 1) {
      check(egress.some((r) => rulePortAdmits(r, "grpc", grpcPort) &&
                               (r.to || []).some((t) => peerIs(t, psLabels))),
            `the NetworkPolicies do not let ${who} reach dp-ps's port grpc`);
    }
  }
  const grpcRules = ingressOf(psPolicies).filter((r) => rulePortAdmits(r, "grpc", grpcPort));
  check(grpcRules.some((r) => (r.from || []).some((f) => peerIs(f, wLabels))),
        "the NetworkPolicies do not admit the workers to dp-ps's port grpc");
  if (shards > 1) {
    check(grpcRules.some((r) => (r.from || []).some((f) => peerIs(f, psLabels))),
          "the NetworkPolicies do not admit dp-ps's shards to port grpc (shard 0 " +
          "collects the model from the others)");
  }
  for (const r of grpcRules) {
    const open = !r.from || r.from.length === 0 ||
                 r.from.some((f) => !(peerIs(f, wLabels) || peerIs(f, psLabels)));
    check(!open, "a NetworkPolicy admits more than the workers and dp-ps's shards to " +
                 `port grpc: ${JSON.stringify(r)}`);
  }
  const scrapers = new Set();
  for (const [who, pols, port] of [["dp-ps", psPolicies, metricsPort],
                                   ["the workers", wPolicies, Number(wc.metrics_port)]]) {
    const rules = ingressOf(pols).filter((r) => rulePortAdmits(r, "metrics", port));
    check(rules.some((r) => (r.from || []).some(
              (f) => f.podSelector?.matchLabels?.["app.kubernetes.io/name"] === "prometheus")),
          `the NetworkPolicies do not admit Prometheus to the metrics port of ${who}`);
    for (const r of rules) scrapers.add(canonical(r.from));
  }
  check(scrapers.size === 1, "the scraper is chosen in more than one place (every " +
                             "metrics rule must admit the same peers): " +
                             [...scrapers].join(" vs "));

  // TLS: when dp-ps has a certificate, the workers verify it, both sides'
  // files come from mounted Secrets, and dp-ps's names the host workers
  // dial.
  if (pc.tls_cert) {
    check(wc.tls_ca, "dp-ps has TLS but workers do not verify it (--tls_ca)");
    if (pc.tls_ca) check(wc.tls_cert && wc.tls_key, "dp-ps wants client certificates " +
                                                    "(--tls_ca) but workers present none");
    const secretOf = {};
    for (const [who, pod, c, conf] of [["dp-ps", w.ps.pod, ps, pc],
                                       ["dp-worker", w.worker.pod, worker, wc]]) {
      for (const flag of ["tls_cert", "tls_key", "tls_ca"]) {
        if (!conf[flag]) continue;
        const v = volumeOf(pod, c, conf[flag]);
        check(v && v.secret, `${who} --${flag}=${conf[flag]} is not on a Secret volume`);
        if (v && v.secret) {
          secretOf[who] = v.secret.secretName;
          check((v.secret.defaultMode & 0o007) === 0,
                `${who}: Secret ${v.secret.secretName} is readable by others`);
          if (!pod.spec.securityContext?.fsGroup) {
            check((v.secret.defaultMode & 0o400) && !(v.secret.defaultMode & 0o040),
                  `${who}: Secret ${v.secret.secretName} files are root's; set fsGroup`);
          }
        }
      }
    }
    const certs = objects.filter((o) => o.kind === "Certificate");
    if (certs.length > 0) {
      for (const who of ["dp-ps", "dp-worker"]) {
        check(certs.some((c) => c.spec.secretName === secretOf[who]),
              `no Certificate writes Secret ${secretOf[who]} of ${who}`);
      }
      const server = certs.find((c) => c.spec.secretName === secretOf["dp-ps"]);
      const names = wc.tls_server_name ? [wc.tls_server_name]
                                       : (workerAddresses.addresses || []).map(hostOf);
      for (const name of names) {
        check(server && (server.spec.dnsNames || []).includes(name),
              `dp-ps's Certificate does not name ${name}, a host workers verify`);
      }
      check(server && (server.spec.usages || []).includes("server auth"),
            "dp-ps's Certificate lacks the usage server auth");
      if (shards > 1) {
        // Shard 0 dials the others by --shard_addresses, verifying those
        // names, and presents dp-ps's certificate as its client certificate.
        for (const name of (shardAddresses.addresses || []).map(hostOf)) {
          check(server && (server.spec.dnsNames || []).includes(name),
                `dp-ps's Certificate does not name ${name}, which shard 0 verifies`);
        }
        if (pc.tls_ca) {
          check(server && (server.spec.usages || []).includes("client auth"),
                "dp-ps's Certificate lacks the usage client auth, which shard 0 needs " +
                "to collect the model from the other shards");
        }
      }
      const client = certs.find((c) => c.spec.secretName === secretOf["dp-worker"]);
      check(client && (client.spec.usages || []).includes("client auth"),
            "the workers' Certificate lacks the usage client auth");
      check(server && client && server.spec.issuerRef.name === client.spec.issuerRef.name,
            "dp-ps's and the workers' certificates come from different issuers");
      // A CA renewed with a new key leaves the leaves' ca.crt stale until
      // each is renewed: restarted peers reject each other meanwhile.
      for (const ca of certs.filter((c) => c.spec.isCA)) {
        check(ca.spec.privateKey?.rotationPolicy === "Never",
              `CA Certificate ${ca.metadata.name} gets a new key at renewal ` +
              "(rotationPolicy is not Never)");
      }
    }
  }

  errors.push(...tokenErrors(w, ps, worker, pc, wc));

  // GPU variants.
  const gpus = worker.resources?.limits?.["nvidia.com/gpu"];
  if (target.includes("gpu") || target.includes("tls") || target === "overlays/jobset" ||
      target.startsWith("overlays/jobset")) {
    check(Number(gpus) === 1, `${target}: nvidia.com/gpu limit ${gpus}`);
    check(wc.backend === "cuda", `${target}: --backend=${wc.backend}`);
    check(/-cuda$/.test(worker.image), `${target}: worker image ${worker.image} is not ` +
                                       "the GPU build (tag -cuda)");
    const cache = wRun.env.CUDA_CACHE_PATH;
    const v = cache && volumeOf(w.worker.pod, worker, cache);
    check(v && v.emptyDir, `${target}: CUDA_CACHE_PATH=${cache} is not on an emptyDir`);
    check(wRun.env.NVIDIA_DISABLE_REQUIRE === "true",
          `${target}: GPU workers need NVIDIA_DISABLE_REQUIRE=true: on a driver older ` +
          "than the image's CUDA the toolkit refuses the container, and the pod sits in " +
          "CreateContainerError holding its GPU; dp-worker says why and exits " +
          `${EXIT.cannotRunHere} instead`);
  }
  if (target === "overlays/cpu") {
    check(gpus === undefined, "cpu overlay asks for a GPU");
    check(wc.backend === "cpu", `cpu overlay: --backend=${wc.backend}`);
  }

  // Monitoring, where the component is included: the release label that
  // kube-prometheus-stack selects them by.
  const release = YAML.parse(fs.readFileSync(RELEASE_LABEL, "utf8")).labels?.release;
  check(release, `${path.relative(REPO, RELEASE_LABEL)} sets no release label`);
  for (const m of objects.filter((o) => ["ServiceMonitor", "PodMonitor",
                                         "PrometheusRule"].includes(o.kind))) {
    check(m.metadata.labels?.release === release,
          `${m.kind} ${m.metadata.name} has release label ` +
          `'${m.metadata.labels?.release}', not '${release}' (release-label.yaml): ` +
          "kube-prometheus-stack would not select it");
  }
  for (const sm of objects.filter((o) => o.kind === "ServiceMonitor")) {
    check(labelsMatch(sm.spec.selector?.matchLabels, svc.metadata.labels || {}),
          `ServiceMonitor ${sm.metadata.name} does not select the Service`);
    check(sm.spec.jobLabel === JOB_LABEL && svc.metadata.labels?.[JOB_LABEL] === "dp-ps",
          `ServiceMonitor ${sm.metadata.name}: series must get job="dp-ps" ` +
          `(jobLabel ${JOB_LABEL})`);
    for (const ep of sm.spec.endpoints || []) {
      check(svcPort(ep.port), `ServiceMonitor port ${ep.port} not on the Service`);
    }
  }
  for (const pm of objects.filter((o) => o.kind === "PodMonitor")) {
    check(labelsMatch(pm.spec.selector?.matchLabels, w.worker.pod.metadata.labels),
          `PodMonitor ${pm.metadata.name} does not select the workers`);
    check(pm.spec.jobLabel === JOB_LABEL &&
              w.worker.pod.metadata.labels?.[JOB_LABEL] === "dp-worker",
          `PodMonitor ${pm.metadata.name}: series must get job="dp-worker" ` +
          `(jobLabel ${JOB_LABEL}), not <namespace>/${pm.metadata.name}`);
    for (const ep of pm.spec.podMetricsEndpoints || []) {
      check(containerPort(worker, ep.port), `PodMonitor port ${ep.port} is not a worker port`);
    }
  }
  // The rules and the dashboard are the cluster's, applied once
  // (monitoring/): a copy per experiment duplicates every series and alert,
  // and deleting one experiment would delete the shared dashboard.
  for (const o of objects.filter((x) => x.kind === "PrometheusRule" ||
                                        x.metadata.labels?.grafana_dashboard === "1")) {
    check(false, `${o.kind} ${o.metadata.name} belongs to the cluster's monitoring ` +
                 "(deploy/k8s/monitoring, applied once), not to each experiment");
  }
  return errors;
}

// The checks of the cluster-wide monitoring (deploy/k8s/monitoring): the
// promtool-tested rules, the dashboard, the release label, one namespace.
function monitoringErrors(objects) {
  const errors = [];
  const check = (cond, message) => {
    if (!cond) errors.push(message);
  };
  const rule = find(objects, "PrometheusRule");
  check(rule && canonical(rule.spec.groups) === canonical(ruleGroups()),
        "the PrometheusRule is not deploy/prometheus/rules (run " +
        "deploy/tests/render-prometheus-rule.js)");
  const release = YAML.parse(fs.readFileSync(RELEASE_LABEL, "utf8")).labels?.release;
  check(rule?.metadata.labels?.release === release,
        `PrometheusRule has release label '${rule?.metadata.labels?.release}', not ` +
        `'${release}' (release-label.yaml): kube-prometheus-stack would not load it`);
  const dashboards = objects.filter((o) => o.kind === "ConfigMap" &&
                                           o.metadata.labels?.grafana_dashboard === "1");
  check(dashboards.length === 1, `${dashboards.length} dashboard ConfigMaps, not 1`);
  for (const cm of dashboards) {
    check(JSON.stringify(Object.keys(cm.data || {})) === '["dp-ps.json"]' &&
              cm.data["dp-ps.json"] === fs.readFileSync(GRAFANA_DASHBOARD, "utf8"),
          `ConfigMap ${cm.metadata.name} is not deploy/grafana/dashboards/dp-ps.json`);
  }
  const namespaces = new Set(objects.map((o) => o.metadata.namespace));
  check(namespaces.size === 1 && !namespaces.has(undefined),
        "the cluster's monitoring objects must go to one namespace, the stack's " +
        `(got ${[...namespaces].join(", ")})`);
  return errors;
}

// The one-off pod of docs/deploying.md that reads the model off the JobSet's
// state volume (dp-ps has exited): the block after MODEL_READER_MARK, a
// Pod in a heredoc and the `kubectl cp` from it. {pod, cp: {pod, file}}
// or {error}.
const DEPLOYING_MD = path.join(REPO, "docs/deploying.md");
const MODEL_READER_MARK = "<!-- manifests-check: model-reader -->";
function modelReader() {
  const lines = fs.readFileSync(DEPLOYING_MD, "utf8").split("\n");
  const mark = lines.indexOf(MODEL_READER_MARK);
  if (mark < 0) return {error: `docs/deploying.md has no block after ${MODEL_READER_MARK}`};
  const end = lines.indexOf("```", mark + 2);
  const block = lines.slice(mark + 2, end < 0 ? lines.length : end);
  const open = block.findIndex((l) => /<<'EOF'$/.test(l));
  const close = block.indexOf("EOF", open + 1);
  const cp = block.map((l) => /^kubectl cp (\S+)\/([^:\s]+):(\S+) \S+$/.exec(l)).find(Boolean);
  if (open < 0 || close < 0 || !cp) {
    return {error: "the model-reader block of docs/deploying.md has no Pod in a " +
                   "<<'EOF' heredoc or no `kubectl cp NS/POD:FILE DEST`"};
  }
  return {pod: YAML.parse(block.slice(open + 1, close).join("\n")),
          cp: {pod: cp[2], file: cp[3]}};
}

// The reader against the JobSet variant as rendered: it mounts dp-ps's
// state claim, read-only, where dp-ps has it, copies dp-ps's --save_model,
// runs dp-ps's image as dp-ps's user, and is a valid Pod.
function modelReaderErrors(reader, objects, bins) {
  if (reader.error) return [reader.error];
  const errors = [];
  const check = (cond, message) => {
    if (!cond) errors.push(message);
  };
  const pod = reader.pod;
  check(pod?.kind === "Pod", `docs/deploying.md's model reader is a ${pod?.kind}, not a Pod`);
  if (pod?.kind !== "Pod") return errors;
  for (const e of schemaErrors(pod)) errors.push(`the model reader: ${e}`);
  const w = workloads(objects);
  const ps = w.ps.pod.spec.containers.find((c) => c.name === "dp-ps");
  const run = dryRun(bins["dp-ps"], ps, objects, {}, psPodFields(w, 0));
  const state = volumeOf(w.ps.pod, ps, run.config.save_model || "");
  const claim = state?.persistentVolumeClaim?.claimName;
  const c = (pod.spec?.containers || [])[0] || {};
  check(reader.cp.pod === pod.metadata?.name,
        `kubectl cp reads pod ${reader.cp.pod}, not the reader ${pod.metadata?.name}`);
  check(reader.cp.file === run.config.save_model,
        `kubectl cp reads ${reader.cp.file}, not the JobSet's dp-ps --save_model=` +
        `${run.config.save_model}`);
  const v = volumeOf(pod, c, reader.cp.file);
  check(v?.persistentVolumeClaim?.claimName === claim,
        `the model reader mounts claim ${v?.persistentVolumeClaim?.claimName} at ` +
        `${reader.cp.file}, not dp-ps's state claim ${claim}`);
  const mount = (c.volumeMounts || []).find((m) => m.name === v?.name);
  const psMount = ps.volumeMounts.find((m) => m.name === state?.name);
  check(mount && psMount && mount.mountPath === psMount.mountPath,
        `the model reader mounts the claim at ${mount?.mountPath}, dp-ps at ` +
        `${psMount?.mountPath}`);
  check(mount?.readOnly === true && v?.persistentVolumeClaim?.readOnly === true,
        "the model reader must mount the state claim read-only");
  check(c.image === ps.image, `the model reader runs ${c.image}, not dp-ps's ${ps.image}`);
  const uid = (p, x) => x.securityContext?.runAsUser ?? p.spec.securityContext?.runAsUser;
  check(uid(pod, c) === uid(w.ps.pod, ps),
        `the model reader runs as uid ${uid(pod, c)}, dp-ps as ${uid(w.ps.pod, ps)} ` +
        "(the owner of the files)");
  return errors;
}

// Broken copies of the model reader that modelReaderErrors must reject:
// [name, mutation of a copy of modelReader(), the error it must give].
const READER_MUTATIONS = [
  ["another claim", (r) => {
    r.pod.spec.volumes[0].persistentVolumeClaim.claimName = "state";
  }, /mounts claim state at \/var\/lib\/dp-ps\/run-1\.safetensors, not dp-ps's state claim dp-ps-state/],
  ["another file", (r) => {
    r.cp.file = "/var/lib/dp-ps/model.safetensors";
  }, /not the JobSet's dp-ps --save_model/],
  ["a writable mount", (r) => {
    delete r.pod.spec.containers[0].volumeMounts[0].readOnly;
  }, /read-only/],
  ["another user", (r) => {
    r.pod.spec.securityContext.runAsUser = 1000;
  }, /runs as uid 1000/],
];

// The plain and JobSet variants run the same pods: their containers agree
// except for dp-ps's DP_EXIT_WHEN_DONE (a Job's pod ends when done) and
// where its shard index and DNS name come from (the StatefulSet's ordinal;
// the JobSet's one shard, by hostname and subdomain).
function variantsAgree(plain, jobset) {
  const a = workloads(plain);
  const b = workloads(jobset);
  if (!a || !b) return ["a variant has no workloads"];
  const errors = [];
  const strip = (pod) => {
    const spec = JSON.parse(JSON.stringify(pod.spec));
    for (const c of spec.containers) {
      c.env = (c.env || []).filter((e) => !["DP_EXIT_WHEN_DONE", "DP_SHARD"].includes(e.name));
    }
    delete spec.hostname;
    delete spec.subdomain;
    // The state volume: a claim template or a PersistentVolumeClaim.
    spec.volumes = (spec.volumes || []).filter((v) => !v.persistentVolumeClaim);
    delete spec.restartPolicy;
    // Lists keyed by name: their order does not matter.
    const byName = (list) => (list || []).slice().sort((x, y) => x.name.localeCompare(y.name));
    spec.volumes = byName(spec.volumes);
    for (const c of spec.containers) c.volumeMounts = byName(c.volumeMounts);
    return {labels: pod.metadata.labels, spec};
  };
  for (const who of ["ps", "worker"]) {
    const x = canonical(strip(a[who].pod));
    const y = canonical(strip(b[who].pod));
    if (x !== y) {
      errors.push(`the ${who} pod of the JobSet differs from the plain variant's:\n` +
                  `  plain:  ${x}\n  jobset: ${y}`);
    }
  }
  for (const key of ["backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes",
                     "activeDeadlineSeconds", "podFailurePolicy", "completionMode"]) {
    if (canonical(a.worker.job[key]) !== canonical(b.worker.job[key])) {
      errors.push(`the workers' ${key} differs between the plain and JobSet variants`);
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

const psContainer = (objs) => workloads(objs).ps.pod.spec.containers[0];
const workerContainer = (objs) => workloads(objs).worker.pod.spec.containers[0];
const cm = (objs, prefix) => configMap(objs, prefix).data;

// Broken copies of a rendered variant that the checks must reject:
// [name, variant, mutation, strict (also run the TypeScript check),
// expect (optional: a new error must match it, the intended reason)].
const MUTATIONS = [
  ["unknown field in a container", "overlays/gpu", (objs) => {
    workerContainer(objs).imagePullPolicyy = "Always";
  }, true],
  ["a field newer than Kubernetes " + MIN_KUBERNETES + " (Job managedBy)", "overlays/gpu",
   (objs) => {
     workersJob(objs).spec.managedBy = "kueue.x-k8s.io/multikueue";
   }, true],
  ["unknown field in the JobSet", "overlays/jobset", (objs) => {
    find(objs, "JobSet").spec.successPolicy.targetReplicatedJob = ["workers"];
  }],
  ["unknown field in a JobSet's pod", "overlays/jobset", (objs) => {
    workerContainer(objs).imagePullPolicyy = "Always";
  }, true],
  ["wrong type (completions as a string)", "overlays/gpu", (objs) => {
    workersJob(objs).spec.completions = "2";
  }],
  ["dp-ps probe on the TLS port", "overlays/tls", (objs) => {
    psContainer(objs).readinessProbe.grpc.port = 5000;
  }],
  ["DP_* variable no flag reads", "overlays/gpu", (objs) => {
    cm(objs, "dp-ps-config").DP_EPOCH = "3";
  }],
  ["worker count differs from completions", "overlays/gpu", (objs) => {
    workersJob(objs).spec.parallelism = 3;
  }],
  ["JobSet worker count differs", "overlays/jobset", (objs) => {
    workloads(objs).worker.job.completions = 3;
  }],
  ["a global batch that follows DP_WORKERS", "overlays/gpu", (objs) => {
    delete cm(objs, "dp-ps-config").DP_GLOBAL_BATCH;
  }, false, /--global_batch=0: set DP_GLOBAL_BATCH/],
  ["workers' parallelism below --min_workers", "overlays/gpu", (objs) => {
    cm(objs, "dp-ps-config").DP_MIN_WORKERS = "2";
    workersJob(objs).spec.parallelism = 1;
  }, false, /parallelism 1 is not in dp-ps --min_workers 2 \.\. completions 2: the steps/],
  ["a worker stopped by a lower parallelism counted against its rank", "overlays/gpu",
   (objs) => {
     const rules = workersJob(objs).spec.podFailurePolicy.rules;
     rules.splice(rules.findIndex((r) => r.onExitCodes?.values.includes(3)), 1);
   }, false, /exit code 3 \(stopped by SIGTERM\) must be retried without counting/],
  ["invalid flag value", "overlays/gpu", (objs) => {
    cm(objs, "dp-worker-config").DP_BACKEND = "tpu";
  }],
  ["worker pointed at another host", "overlays/gpu", (objs) => {
    workerContainer(objs).env = [{name: "DP_PS", value: "parameter-server:5000"}];
  }],
  ["workers dialing the Service name instead of each shard", "overlays/tls, 3 shards",
   (objs) => {
     workerContainer(objs).env = [{name: "DP_PS", value: "dp-ps:5000"}];
   }],
  ["a DP_SHARD_ADDRESSES template on another port", "overlays/tls, 3 shards", (objs) => {
    cm(objs, "dp-ps-config").DP_SHARD_ADDRESSES = "dp-ps-{shard}.dp-ps:5050";
  }, false, /^dp-ps --shard_addresses=dp-ps-\{shard\}\.dp-ps:5050 .*not exactly the 3 shard/],
  ["an explicit DP_SHARD_ADDRESSES missing a pod", "overlays/tls, 3 shards", (objs) => {
    cm(objs, "dp-ps-config").DP_SHARD_ADDRESSES = "dp-ps-0.dp-ps:5000,dp-ps-1.dp-ps:5000";
  }, false, /^dp-ps --shard_addresses=dp-ps-0\.dp-ps:5000,dp-ps-1\.dp-ps:5000 .*not exactly/],
  ["workers without DP_SHARDS", "overlays/tls, 3 shards", (objs) => {
    const c = workerContainer(objs);
    c.env = c.env.filter((e) => e.name !== "DP_SHARDS");
  }, false, /^dp-worker --dry_run .* exited 2:[\s\S]*\{shard\}.*shard count/],
  ["workers with a copy of S (DP_SHARDS as a literal)", "overlays/tls, 3 shards", (objs) => {
    const e = workerContainer(objs).env.find((x) => x.name === "DP_SHARDS");
    delete e.valueFrom;
    e.value = "3";
  }, false, /^the workers get DP_SHARDS from the literal '3'/],
  ["JobSet workers' DP_SHARDS from another key", "overlays/jobset", (objs) => {
    workerContainer(objs).env.find((x) => x.name === "DP_SHARDS")
        .valueFrom.configMapKeyRef.key = "DP_WORKERS";
  }, false, /^the workers get DP_SHARDS from ConfigMap dp-ps-config-\S+ key DP_WORKERS/],
  ["StatefulSet replicas differ from DP_SHARDS", "overlays/tls, 3 shards", (objs) => {
    find(objs, "StatefulSet", "dp-ps").spec.replicas = 2;
  }],
  ["shard index not from the pod", "overlays/tls, 3 shards", (objs) => {
    const env = psContainer(objs).env.find((e) => e.name === "DP_SHARD");
    delete env.valueFrom;
    env.value = "0";
  }],
  ["shards started one after another", "overlays/gpu", (objs) => {
    delete find(objs, "StatefulSet", "dp-ps").spec.podManagementPolicy;
  }],
  ["Service hiding starting shards", "overlays/gpu", (objs) => {
    delete find(objs, "Service", "dp-ps").spec.publishNotReadyAddresses;
  }],
  ["NetworkPolicy keeping shard 0 from the other shards", "overlays/tls, 3 shards",
   (objs) => {
     const rule = find(objs, "NetworkPolicy", "dp-ps").spec.ingress[0];
     rule.from = rule.from.filter(
         (f) => f.podSelector?.matchLabels?.["app.kubernetes.io/name"] !== "dp-ps");
   }],
  ["a shard's name missing from dp-ps's certificate", "overlays/tls, 3 shards", (objs) => {
    const cert = find(objs, "Certificate", "dp-ps-tls");
    cert.spec.dnsNames = cert.spec.dnsNames.filter((n) => n !== "dp-ps-2.dp-ps");
  }],
  ["dp-ps's certificate without client auth for shard 0", "overlays/tls, 3 shards",
   (objs) => {
     const cert = find(objs, "Certificate", "dp-ps-tls");
     cert.spec.usages = cert.spec.usages.filter((u) => u !== "client auth");
   }],
  ["JobSet with two dp-ps shards", "overlays/jobset", (objs) => {
    cm(objs, "dp-ps-config").DP_SHARDS = "2";
  }],
  ["unknown container argument", "overlays/gpu", (objs) => {
    psContainer(objs).args = ["--bogus=1"];
  }],
  ["missing FailJob rule", "overlays/gpu", (objs) => {
    workersJob(objs).spec.podFailurePolicy.rules.shift();
  }],
  ["checkpoints outside the run's directory", "overlays/gpu", (objs) => {
    psContainer(objs).env.find((e) => e.name === "DP_CHECKPOINT_DIR").value =
        "/var/lib/dp-ps/checkpoints";
  }],
  ["a PodDisruptionBudget that blocks drains", "overlays/gpu", (objs) => {
    objs.push({apiVersion: "policy/v1", kind: "PodDisruptionBudget",
               metadata: {name: "dp-ps"},
               spec: {maxUnavailable: 0,
                      selector: {matchLabels: {"app.kubernetes.io/name": "dp-ps"}}}});
  }],
  ["NetworkPolicy open to every pod", "overlays/gpu", (objs) => {
    find(objs, "NetworkPolicy", "dp-ps").spec.ingress[0].from = [];
  }],
  ["PodMonitor without jobLabel", "overlays/gpu", (objs) => {
    delete find(objs, "PodMonitor").spec.jobLabel;
  }],
  ["an experiment with its own copy of the rules", "overlays/gpu", (objs) => {
    objs.push({apiVersion: "monitoring.coreos.com/v1", kind: "PrometheusRule",
               metadata: {name: "dp-ps"}, spec: {groups: ruleGroups()}});
  }, false, /PrometheusRule dp-ps belongs to the cluster's monitoring/],
  ["a PrometheusRule without the release label", "monitoring", (objs) => {
    delete find(objs, "PrometheusRule").metadata.labels.release;
  }, false, /PrometheusRule has release label 'undefined'/],
  ["PrometheusRule differs from the promtool-tested rules", "monitoring", (objs) => {
    find(objs, "PrometheusRule").spec.groups[0].rules.pop();
  }],
  ["workers without the token dp-ps requires", "overlays/tls + token", (objs) => {
    delete cm(objs, "dp-worker-config").DP_AUTH_TOKEN_FILE;
  }, false, /dp-ps requires a token .* but the workers send none/],
  ["the workers' token from another Secret", "overlays/jobset + token", (objs) => {
    workloads(objs).worker.pod.spec.volumes.find((v) => v.name === "auth-token")
        .secret.secretName = "other-token";
  }, false, /the workers from another Secret, other-token/],
  ["a token readable by others", "overlays/tls + token", (objs) => {
    workloads(objs).ps.pod.spec.volumes.find((v) => v.name === "auth-token")
        .secret.defaultMode = 0o444;
  }, false, /dp-ps: Secret dp-ps-auth-token \(mode 444\) is readable by others/],
  ["JobSet workers' token without fsGroup", "overlays/jobset + token", (objs) => {
    delete workloads(objs).worker.pod.spec.securityContext.fsGroup;
  }, false, /dp-worker: Secret dp-ps-auth-token must be readable by the pod's fsGroup/],
  ["a token file outside the Secret", "overlays/jobset + token", (objs) => {
    cm(objs, "dp-ps-config").DP_AUTH_TOKEN_FILE = "/tmp/token";
  }, false, /dp-ps --auth_token_file=\/tmp\/token is not on a Secret volume/],
  ["worker TLS key outside the Secret", "overlays/tls", (objs) => {
    cm(objs, "dp-worker-config").DP_TLS_KEY = "/tmp/tls.key";
  }],
  ["dp-ps certificate for another name", "overlays/tls", (objs) => {
    find(objs, "Certificate", "dp-ps-tls").spec.dnsNames = ["parameter-server"];
  }],
  ["JobSet succeeding with dp-ps", "overlays/jobset", (objs) => {
    find(objs, "JobSet").spec.successPolicy.targetReplicatedJobs = ["ps"];
  }],
  ["JobSet workers not waiting for dp-ps", "overlays/jobset", (objs) => {
    delete workloads(objs).worker.rj.dependsOn;
  }],
  ["a Job-wide backoffLimit instead of retries per rank", "overlays/gpu", (objs) => {
    const spec = workersJob(objs).spec;
    delete spec.backoffLimitPerIndex;
    delete spec.maxFailedIndexes;
    spec.backoffLimit = 6;
  }, false, /retries must be per rank/],
  ["dp-ps unreachable (exit 4) counted against the workers", "overlays/gpu", (objs) => {
    const rules = workersJob(objs).spec.podFailurePolicy.rules;
    rules.splice(rules.findIndex((r) => r.onExitCodes?.values.includes(4)), 1);
  }, false, /exit code 4 \(dp-ps unreachable\)/],
  ["a node that cannot run the backend (exit 5) failing the JobSet", "overlays/jobset",
   (objs) => {
     const rule = workloads(objs).worker.job.podFailurePolicy.rules.find(
         (r) => r.onExitCodes?.values.includes(5));
     rule.action = "FailJob";
   }, false, /exit code 5 \(this node cannot run/],
  ["workers without a deadline", "overlays/gpu", (objs) => {
    delete workersJob(objs).spec.activeDeadlineSeconds;
  }, false, /no activeDeadlineSeconds/],
  ["the workers' Job named without the run id", "overlays/gpu", (objs) => {
    workersJob(objs).metadata.name = "dp-worker";
  }, false, /named dp-worker, not dp-worker-run-1/],
  ["the JobSet named without the run id", "overlays/jobset", (objs) => {
    find(objs, "JobSet").metadata.name = "dp-train";
  }, false, /named dp-train, not dp-train-run-1/],
  ["a run id too long for the pods' host names", "overlays/gpu", (objs) => {
    cm(objs, "dp-run").RUN_ID = "a".repeat(40);
  }, false, /RUN_ID 'a+' must be 1 to 32/],
  ["a PodMonitor without the release label", "overlays/gpu", (objs) => {
    delete find(objs, "PodMonitor").metadata.labels.release;
  }, false, /PodMonitor dp-worker has release label 'undefined'/],
  ["GPU workers behind the toolkit's driver check", "overlays/gpu", (objs) => {
    delete cm(objs, "dp-worker-config").NVIDIA_DISABLE_REQUIRE;
  }, false, /NVIDIA_DISABLE_REQUIRE/],
  ["workers cut off from DNS under a default deny", "overlays/gpu", (objs) => {
    const np = find(objs, "NetworkPolicy", "dp-worker");
    np.spec.egress = np.spec.egress.filter((r) => !(r.ports || []).some((p) => p.port === 53));
  }, false, /do not let the workers reach DNS/],
  ["workers cut off from dp-ps under a default deny", "overlays/jobset", (objs) => {
    const np = find(objs, "NetworkPolicy", "dp-worker");
    np.spec.egress = np.spec.egress.filter((r) => r.to === undefined);
  }, false, /do not let the workers reach dp-ps's port grpc/],
  ["shard 0 cut off from the other shards' gRPC port", "overlays/tls, 3 shards",
   (objs) => {
     const np = find(objs, "NetworkPolicy", "dp-ps");
     np.spec.egress = np.spec.egress.filter((r) => r.to === undefined);
   }, false, /do not let dp-ps reach dp-ps's port grpc/],
  ["worker metrics closed to Prometheus", "overlays/gpu", (objs) => {
    find(objs, "NetworkPolicy", "dp-metrics").spec.podSelector.matchExpressions[0].values =
        ["dp-ps"];
  }, false, /do not admit Prometheus to the metrics port of the workers/],
  ["a second place choosing the scraper", "overlays/gpu", (objs) => {
    find(objs, "NetworkPolicy", "dp-worker").spec.ingress = [{
      from: [{podSelector: {matchLabels: {"app.kubernetes.io/name": "prometheus"}}}],
      ports: [{port: "metrics"}],
    }];
  }, false, /the scraper is chosen in more than one place/],
  ["dp-ps Burstable (request below limit)", "overlays/gpu", (objs) => {
    psContainer(objs).resources.requests.cpu = "1";
  }, false, /dp-ps's cpu request 1 != its limit 2/],
  ["dp-ps update threads over its CPU limit", "overlays/cpu", (objs) => {
    cm(objs, "dp-ps-config").DP_UPDATE_THREADS = "0";
  }, false, /--update_threads=0 is not 1\.\.its CPU limit/],
  ["shards free to share a node", "overlays/tls, 3 shards", (objs) => {
    delete workloads(objs).ps.pod.spec.affinity;
  }, false, /not spread over nodes/],
  ["a CA that renews with a new key", "overlays/tls", (objs) => {
    delete find(objs, "Certificate", "dp-ps-ca").spec.privateKey.rotationPolicy;
  }, false, /CA Certificate dp-ps-ca gets a new key/],
  ["workers with a service account token", "overlays/jobset", (objs) => {
    delete workloads(objs).worker.pod.spec.automountServiceAccountToken;
  }, false, /dp-worker pods mount a service account token/],
  ["GPU worker without a CUDA cache volume", "overlays/gpu", (objs) => {
    cm(objs, "dp-worker-config").CUDA_CACHE_PATH = "/root/.nv";
  }],
];

function main() {
  const bins = parseArgs(process.argv.slice(2));
  const rendered = {};
  for (const [name, target] of Object.entries(TARGETS)) {
    try {
      rendered[name] = render(target);
      report(`kubectl kustomize ${name} (${rendered[name].length} objects)`, []);
    } catch (e) {
      const hint = e.code === "ENOENT"
          ? " (kubectl >= 1.21 is needed; it is not a Debian 12 package)" : "";
      report(`kubectl kustomize ${name}`, [String(e.stderr || e.message) + hint]);
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
  const reader = modelReader();
  if (reader.pod) all.push({label: "docs/deploying.md: the model reader", obj: reader.pod});
  report(`Kubernetes ${MIN_KUBERNETES} API and CRD types: no unknown field, ` +
         "none missing (all variants, the model reader)", unknownFieldErrors(all));
  for (const [target, objects] of Object.entries(rendered)) {
    if (target === "monitoring") {
      report("the cluster's monitoring: rules, dashboard, release label",
             monitoringErrors(objects));
    } else {
      report(`drift: ${target} against dp-ps/dp-worker --dry_run`,
             driftErrors(objects, bins, target));
    }
  }
  if (rendered["overlays/jobset"]) {
    report("docs/deploying.md's model reader reads the JobSet's state volume",
           modelReaderErrors(reader, rendered["overlays/jobset"], bins));
  }
  if (rendered["base"] && rendered["jobset"]) {
    report("the JobSet runs the same pods as the plain variant",
           variantsAgree(rendered["base"], rendered["jobset"]));
  }
  if (rendered["overlays/gpu"] && rendered["overlays/jobset"]) {
    report("the GPU JobSet runs the same pods as overlays/gpu",
           variantsAgree(rendered["overlays/gpu"], rendered["overlays/jobset"]));
  }

  // Self-test: every check above can fail. A mutation must add an error
  // that the intact variant does not have.
  const baselines = {};
  for (const [name, target, mutate, strict, expect] of MUTATIONS) {
    if (!rendered[target]) continue;
    const errorsOf = (objs) => [
      ...objs.flatMap((o) => schemaErrors(o)),
      ...(strict ? unknownFieldErrors(objs.map((obj) => ({label: target, obj}))) : []),
      ...(target === "monitoring" ? monitoringErrors(objs)
                                  : driftErrors(objs, bins, target)),
    ];
    const key = `${target}/${Boolean(strict)}`;
    baselines[key] ??= new Set(errorsOf(rendered[target]));
    const objs = JSON.parse(JSON.stringify(rendered[target]));
    mutate(objs);
    const added = errorsOf(objs).filter((e) => !baselines[key].has(e));
    let problems = [];
    if (added.length === 0) {
      problems = ["the broken manifest passed every check"];
    } else if (expect && !added.some((e) => expect.test(e))) {
      problems = [`no error matches ${expect}; the errors:`, ...added];
    }
    report(`self-test: rejects ${name} (${target})`, problems);
  }
  if (rendered["overlays/jobset"] && reader.pod) {
    const baseline = new Set(modelReaderErrors(reader, rendered["overlays/jobset"], bins));
    for (const [name, mutate, expect] of READER_MUTATIONS) {
      const broken = JSON.parse(JSON.stringify(reader));
      mutate(broken);
      const added = modelReaderErrors(broken, rendered["overlays/jobset"], bins)
                        .filter((e) => !baseline.has(e));
      report(`self-test: rejects a model reader with ${name}`,
             added.some((e) => expect.test(e)) ? []
                 : [`no error matches ${expect}; the errors:`, ...added]);
    }
  }

  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main();
