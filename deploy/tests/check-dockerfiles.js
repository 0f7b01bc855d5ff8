#!/usr/bin/env node
// What can be checked of deploy/docker without a Docker engine, run by
// ctest:
//  - every source the build stages COPY exists and is not excluded by the
//    Dockerfile's .dockerignore, and every CMake subdirectory is copied;
//  - the build stages install the build packages of scripts/setup.sh;
//  - every file copied from the build stage exists in the local build tree;
//  - ENTRYPOINT, USER and EXPOSE agree with the copied binary and with the
//    rendered manifests (runAsUser/runAsGroup, container ports);
//  - dp-ps's runtime packages are exactly those of the libraries it links
//    (ldd + dpkg -S), beyond the base image's, and dp-ps runs in a chroot
//    holding only the base libraries and those packages' files;
//  - collect-runtime-libs.sh gives dp-worker everything it links beyond the
//    C/C++ runtimes: dp-worker runs in a chroot holding only those.
//
// Usage (as root, for chroot): node check-dockerfiles.js --build-dir DIR
// Exit status 0 when every check passes.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync, spawnSync } = require("child_process");
const YAML = require("yaml");

const REPO = path.resolve(__dirname, "../..");
const DOCKER = path.join(REPO, "deploy/docker");
// Packages of the debian:12-slim base that dp-ps's libraries come from.
const DEBIAN_SLIM_BASE = ["libc6", "libgcc-s1", "libstdc++6", "zlib1g"];
// Libraries the CUDA runtime image provides (collect-runtime-libs.sh skips
// them): the C and C++ runtimes.
const BASE_LIBS = /^(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+)\.so|^ld-linux/;

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

// ---------------------------------------------------------------- parsing

// Stages of a Dockerfile: [{from, name, ops: [{op, args}]}], ARG defaults
// substituted, continuation lines joined, comments dropped.
function parseDockerfile(file) {
  const text = fs.readFileSync(file, "utf8").replace(/\\\n/g, " ");
  const argDefaults = {};
  const stages = [];
  for (let line of text.split("\n")) {
    line = line.trim();
    if (!line || line.startsWith("#")) continue;
    const m = /^(\w+)\s+(.*)$/.exec(line);
    if (!m) continue;
    const op = m[1].toUpperCase();
    const args = m[2].replace(/\$\{(\w+)\}/g, (_, v) => argDefaults[v] ?? `\${${v}}`)
                     .replace(/\s+/g, " ");
    if (op === "ARG" && stages.length === 0) {
      const [k, v] = args.split("=");
      argDefaults[k] = v;
    } else if (op === "FROM") {
      const f = /^(\S+)(?: AS (\S+))?$/i.exec(args);
      stages.push({from: f[1], name: f[2], ops: []});
    } else if (stages.length > 0) {
      stages[stages.length - 1].ops.push({op, args});
    }
  }
  return stages;
}

// COPY arguments: {from, sources, dest}.
function parseCopy(args) {
  const words = args.split(" ");
  let from;
  while (words[0].startsWith("--")) {
    const w = words.shift();
    if (w.startsWith("--from=")) from = w.slice(7);
  }
  return {from, sources: words.slice(0, -1), dest: words[words.length - 1]};
}

// Packages of every `apt-get install` in a stage.
function aptPackages(stage) {
  const pkgs = [];
  for (const {op, args} of stage.ops) {
    if (op !== "RUN") continue;
    for (const cmd of args.split("&&")) {
      const m = /apt-get install (.*)$/.exec(cmd.trim());
      if (!m) continue;
      pkgs.push(...m[1].split(" ").filter((w) => w && !w.startsWith("-")));
    }
  }
  return pkgs;
}

// .dockerignore in the allowlist form this project uses: "*" then
// "!path" lines. True when `rel` (a path in the context) is sent.
function parseDockerignore(file) {
  const rules = [];
  for (const raw of fs.readFileSync(file, "utf8").split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const negate = line.startsWith("!");
    const pattern = line.replace(/^!/, "").replace(/\/$/, "");
    if (pattern !== "*" && /[*?[\]]/.test(pattern)) {
      throw new Error(`${file}: pattern ${line} is beyond this check's matcher`);
    }
    rules.push({negate, pattern});
  }
  return (rel) => {
    let sent = true;
    for (const {negate, pattern} of rules) {
      const matches = pattern === "*" ||
          rel === pattern || rel.startsWith(pattern + "/");
      if (matches) sent = negate;
    }
    return sent;
  };
}

// ---------------------------------------------------------------- host facts

function lddLibraries(binary) {
  const out = execFileSync("ldd", [binary], {encoding: "utf8"});
  const libs = [];
  for (const line of out.split("\n")) {
    const m = /^\s*(\S+) => (\/\S+)/.exec(line);
    if (m) libs.push({name: m[1], path: m[2]});
    if (/not found/.test(line)) throw new Error(`ldd ${binary}: ${line.trim()}`);
  }
  return libs;
}

// The Debian packages owning `files`, one dpkg -S for all: {file: package}
// (usrmerge: a file is looked up as given, by its real path, and both
// without /usr).
function owningPackages(files) {
  const candidates = {};
  for (const file of files) {
    const c = [file, fs.realpathSync(file)];
    for (const x of [...c]) if (x.startsWith("/usr/")) c.push(x.slice(4));
    candidates[file] = c;
  }
  const all = [...new Set(Object.values(candidates).flat())];
  const r = spawnSync("dpkg", ["-S", ...all], {encoding: "utf8"});
  const owner = {};
  for (const line of (r.stdout || "").split("\n")) {
    const m = /^([^:,]+)(?::\S+)?: (\/.*)$/.exec(line);
    if (m) owner[m[2]] = m[1];
  }
  const result = {};
  for (const [file, c] of Object.entries(candidates)) {
    result[file] = c.map((x) => owner[x]).find(Boolean);
  }
  return result;
}
function owningPackage(file) {
  return owningPackages([file])[file];
}

// The loader and C/C++ runtime libraries, as the base images provide them.
function baseLibraries(binary) {
  const out = execFileSync("ldd", [binary], {encoding: "utf8"});
  const files = [];
  for (const line of out.split("\n")) {
    const m = /^\s*(\S+)(?: => (\/\S+))?/.exec(line);
    if (!m) continue;
    const file = m[2] || (m[1].startsWith("/") ? m[1] : undefined);
    if (file && BASE_LIBS.test(path.basename(file))) files.push(file);
  }
  return files;
}

// Copies `file` to the same path under `root`.
function place(root, file, dest = file) {
  const target = path.join(root, dest);
  fs.mkdirSync(path.dirname(target), {recursive: true});
  fs.copyFileSync(fs.realpathSync(file), target);
}

// Runs `argv` in a chroot at `root` with LD_LIBRARY_PATH; returns
// {code, output}.
function runChrooted(root, libraryPath, argv) {
  const chroot = ["/usr/sbin/chroot", "/sbin/chroot", "/usr/bin/chroot"]
                     .find((p) => fs.existsSync(p)) || "chroot";
  const r = spawnSync(chroot, [root, ...argv], {
    encoding: "utf8",
    env: {PATH: "/usr/local/bin:/usr/bin:/bin", LD_LIBRARY_PATH: libraryPath},
  });
  if (r.error) return {code: -1, output: String(r.error)};
  return {code: r.status, output: (r.stdout || "") + (r.stderr || "")};
}

// ---------------------------------------------------------------- checks

function setupBuildPackages() {
  const text = fs.readFileSync(path.join(REPO, "scripts/setup.sh"), "utf8");
  const m = /# build\n([\s\S]*?)\n\s*# data/.exec(text);
  return m ? m[1].split(/\s+/).filter(Boolean) : [];
}

function cmakeSubdirectories() {
  const text = fs.readFileSync(path.join(REPO, "CMakeLists.txt"), "utf8");
  return [...text.matchAll(/^add_subdirectory\((\S+)\)/gm)].map((m) => m[1]);
}

// The pods of the rendered base: {containerName: {user, group, ports}}.
function manifestPods() {
  const out = execFileSync("kubectl",
                           ["kustomize", path.join(REPO, "deploy/k8s/base")],
                           {encoding: "utf8"});
  const pods = {};
  for (const doc of YAML.parseAllDocuments(out).map((d) => d.toJS())) {
    const spec = doc?.spec?.template?.spec;
    if (!spec) continue;
    for (const c of spec.containers) {
      pods[c.name] = {
        user: c.securityContext?.runAsUser ?? spec.securityContext?.runAsUser,
        group: c.securityContext?.runAsGroup ?? spec.securityContext?.runAsGroup,
        ports: (c.ports || []).map((p) => p.containerPort).sort((a, b) => a - b),
      };
    }
  }
  return pods;
}

// Checks shared by both Dockerfiles; returns the parsed stages.
function checkCommon(name, buildDir, pods) {
  const file = path.join(DOCKER, `${name}.Dockerfile`);
  const stages = parseDockerfile(file);
  const build = stages.find((s) => s.name === "build");
  const final = stages[stages.length - 1];

  const context = [];
  let sent;
  try {
    sent = parseDockerignore(`${file}.dockerignore`);
  } catch (e) {
    context.push(String(e.message));
  }
  if (!build) context.push("no stage named build");
  if (final === build) context.push("the final stage is the build stage");
  const copied = new Set();
  for (const stage of stages) {
    for (const {op, args} of stage.ops) {
      if (op === "ADD") context.push(`use COPY, not ADD: ${args}`);
      if (op !== "COPY") continue;
      const c = parseCopy(args);
      if (c.from) continue;
      for (const src of c.sources) {
        const rel = path.normalize(src).replace(/\/$/, "");
        copied.add(rel);
        if (!fs.existsSync(path.join(REPO, rel))) {
          context.push(`COPY ${src}: no such path in the repository`);
        } else if (sent && !sent(rel)) {
          context.push(`COPY ${src}: excluded by ${name}.Dockerfile.dockerignore`);
        }
      }
    }
  }
  for (const dir of ["CMakeLists.txt", ...cmakeSubdirectories()]) {
    if (!copied.has(dir)) context.push(`the build needs ${dir}, not copied`);
  }
  if (build) {
    const have = new Set(aptPackages(build));
    for (const p of setupBuildPackages()) {
      if (!have.has(p)) context.push(`build stage lacks ${p} (scripts/setup.sh)`);
    }
  }
  report(`${name}: build context, sources and build packages`, context);

  // Files copied from the build stage exist in the local build tree, and the
  // entry point is the copied binary.
  const outputs = [];
  let binaryDest;
  for (const {op, args} of final.ops) {
    if (op !== "COPY") continue;
    const c = parseCopy(args);
    if (c.from !== "build") continue;
    for (const src of c.sources) {
      if (!src.startsWith("/src/build/")) continue;
      const local = path.join(buildDir, src.slice("/src/build/".length));
      if (!fs.existsSync(local)) outputs.push(`${src}: ${local} does not exist`);
      const target = path.basename(src);
      const built = build?.ops.some((o) => o.op === "RUN" &&
                                           o.args.includes(`--target ${target}`));
      if (!built) outputs.push(`${src}: no cmake --build --target ${target}`);
      if (target === name) binaryDest = c.dest;
    }
  }
  const entry = final.ops.find((o) => o.op === "ENTRYPOINT");
  if (!binaryDest) outputs.push(`the final stage copies no ${name} binary`);
  if (!entry || JSON.stringify(JSON.parse(entry.args)) !==
                    JSON.stringify([binaryDest])) {
    outputs.push(`ENTRYPOINT ${entry?.args} is not ["${binaryDest}"]`);
  }
  report(`${name}: build outputs exist in ${path.relative(REPO, buildDir) || "."}` +
         ` and ENTRYPOINT runs the binary`, outputs);

  // Non-root, the manifests' uid/gid and ports.
  const agree = [];
  const user = final.ops.filter((o) => o.op === "USER").pop();
  const m = user && /^(\d+):(\d+)$/.exec(user.args);
  if (!m || m[1] === "0") {
    agree.push(`USER ${user?.args}: want a numeric non-root uid:gid`);
  } else if (!pods[name]) {
    agree.push(`no container ${name} in deploy/k8s/base`);
  } else {
    if (Number(m[1]) !== pods[name].user || Number(m[2]) !== pods[name].group) {
      agree.push(`USER ${user.args} != runAsUser/runAsGroup ` +
                 `${pods[name].user}:${pods[name].group} of the manifest`);
    }
    const exposed = final.ops.filter((o) => o.op === "EXPOSE")
                        .flatMap((o) => o.args.split(" ").map(Number))
                        .sort((a, b) => a - b);
    if (JSON.stringify(exposed) !== JSON.stringify(pods[name].ports)) {
      agree.push(`EXPOSE ${exposed} != containerPorts ${pods[name].ports}`);
    }
  }
  report(`${name}: non-root USER, ports and uid agree with deploy/k8s`, agree);
  return {stages, build, final};
}

function checkDpPs(buildDir, pods) {
  const {final} = checkCommon("dp-ps", buildDir, pods);
  const binary = path.join(buildDir, "server/dp-ps");
  const errors = [];
  const need = new Set();
  const unowned = [];
  const libs = lddLibraries(binary).map((l) => l.path);
  const owners = owningPackages(libs);
  for (const lib of libs) {
    if (owners[lib]) need.add(owners[lib]); else unowned.push(lib);
  }
  for (const f of unowned) errors.push(`${f} belongs to no Debian package`);
  for (const p of DEBIAN_SLIM_BASE) need.delete(p);
  const listed = new Set(aptPackages(final));
  for (const p of need) {
    if (!listed.has(p)) errors.push(`runtime stage lacks ${p} (dp-ps links it)`);
  }
  for (const p of listed) {
    if (!need.has(p)) errors.push(`runtime stage installs ${p}, which dp-ps does not link`);
  }
  report(`dp-ps: runtime packages are exactly those of its libraries ` +
         `(${[...listed].sort().join(" ")})`, errors);

  // dp-ps runs with the base libraries and those packages' files only.
  const run = [];
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "dp-ps-root-"));
  try {
    // The base image: the loader and the libraries of its packages.
    for (const f of baseLibraries(binary)) place(root, f);
    for (const lib of libs) {
      if (DEBIAN_SLIM_BASE.includes(owners[lib])) place(root, lib);
    }
    for (const p of listed) {
      const files = execFileSync("dpkg", ["-L", p], {encoding: "utf8"}).split("\n");
      for (const f of files) {
        // Libraries and their soname links, as files.
        if (/\.so(\.|$)/.test(f) && fs.existsSync(f)) {
          place(root, f, path.join("/usr/lib/dp", path.basename(f)));
        }
      }
    }
    place(root, binary, "/usr/local/bin/dp-ps");
    const r = runChrooted(root, "/usr/lib/dp", ["/usr/local/bin/dp-ps", "--version"]);
    if (r.code !== 0) run.push(`dp-ps --version in the chroot exited ${r.code}: ${r.output}`);
  } finally {
    fs.rmSync(root, {recursive: true, force: true});
  }
  report("dp-ps: runs with only the base libraries and the runtime packages", run);
}

function checkDpWorker(buildDir, pods) {
  const {stages, build, final} = checkCommon("dp-worker", buildDir, pods);
  const errors = [];
  const cuda = /^nvidia\/cuda:(13\.\d+\.\d+)-(devel|runtime)-/;
  const b = cuda.exec(build?.from || "");
  const f = cuda.exec(final.from);
  if (!b || b[2] !== "devel") errors.push(`build stage FROM ${build?.from}: want CUDA 13 devel`);
  if (!f || f[2] !== "runtime") errors.push(`final stage FROM ${final.from}: want CUDA 13 runtime`);
  if (b && f && b[1] !== f[1]) errors.push(`CUDA ${b[1]} (build) != ${f[1]} (runtime)`);
  // The data set lands at the binary's default --data_dir.
  const header = fs.readFileSync(path.join(REPO, "common/dataset.h"), "utf8");
  const dataDir = /kDefaultFashionMnistDir\[\] =\s*"([^"]+)"/.exec(header)?.[1];
  const dataCopy = final.ops.map((o) => o.op === "COPY" && parseCopy(o.args))
                       .find((c) => c && c.from === "data");
  if (!dataCopy || dataCopy.dest !== dataDir || dataCopy.sources[0] !== dataDir) {
    errors.push(`the data set is not copied to the default --data_dir ${dataDir}`);
  }
  const dataStage = stages.find((s) => s.name === "data");
  if (!dataStage || !aptPackages(dataStage).includes("dataset-fashion-mnist")) {
    errors.push("the data stage does not install dataset-fashion-mnist");
  } else if (owningPackage(path.join(dataDir, "train-images-idx3-ubyte.gz")) !==
             "dataset-fashion-mnist") {
    errors.push(`${dataDir} is not where dataset-fashion-mnist puts the files`);
  }
  report("dp-worker: CUDA 13 devel/runtime bases, data at the default --data_dir",
         errors);

  // collect-runtime-libs.sh + the C/C++ runtimes are all dp-worker needs.
  const run = [];
  const binary = path.join(buildDir, "worker/dp-worker");
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "dp-worker-root-"));
  try {
    execFileSync(path.join(DOCKER, "collect-runtime-libs.sh"),
                 [binary, path.join(root, "opt/dp-worker/lib")]);
    const collected = fs.readdirSync(path.join(root, "opt/dp-worker/lib"));
    for (const lib of lddLibraries(binary)) {
      if (!BASE_LIBS.test(lib.name) && !collected.includes(lib.name)) {
        run.push(`collect-runtime-libs.sh missed ${lib.name}`);
      }
    }
    for (const f of baseLibraries(binary)) place(root, f);
    place(root, binary, "/usr/local/bin/dp-worker");
    for (const argv of [["--version"], ["--dry_run", "--rank=0"]]) {
      const r = runChrooted(root, "/opt/dp-worker/lib",
                            ["/usr/local/bin/dp-worker", ...argv]);
      if (r.code !== 0) {
        run.push(`dp-worker ${argv.join(" ")} in the chroot exited ${r.code}: ` +
                 r.output);
      }
    }
  } catch (e) {
    run.push(String(e.message));
  } finally {
    fs.rmSync(root, {recursive: true, force: true});
  }
  report("dp-worker: runs with only the C/C++ runtimes and the collected " +
         "libraries", run);
}

function main() {
  const i = process.argv.indexOf("--build-dir");
  if (i < 0 || !process.argv[i + 1]) {
    console.error("usage: check-dockerfiles.js --build-dir DIR");
    process.exit(2);
  }
  const buildDir = path.resolve(process.argv[i + 1]);
  const pods = manifestPods();
  checkDpPs(buildDir, pods);
  checkDpWorker(buildDir, pods);
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main();
