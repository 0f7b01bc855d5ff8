#!/usr/bin/env node
// What can be checked of deploy/docker without a Docker engine, run by
// ctest:
//  - every source the build stages COPY exists and is not excluded by the
//    Dockerfile's .dockerignore, and every CMake subdirectory is copied;
//  - the build stages install the build packages of scripts/setup.sh;
//  - every file copied from the build stage exists in the local build tree;
//  - ENTRYPOINT, USER and EXPOSE agree with the copied binary and with the
//    rendered manifests (runAsUser/runAsGroup, container ports);
//  - the runtime packages of dp-ps's image and of dp-worker's cpu image are
//    exactly those of the libraries each binary links (ldd + dpkg -S),
//    beyond the base image's, and each binary runs in a chroot holding only
//    the base libraries and those packages' files;
//  - dp-worker's cpu image has no CUDA at all; its gpu image is the cpu
//    image plus the CUDA backend module at its installed path and only the
//    CUDA runtime packages the module needs (cudart, cuBLAS + cuBLASLt),
//    from the same CUDA version the module is built with.
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
// The loader and the C and C++ runtimes, which every base image has.
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
    } else if (op === "ARG") {
      // Re-declared in a stage: it keeps the global default.
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
  return m ? m[1].split(/\s+/).filter(Boolean) : null;
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

// Checks shared by both Dockerfiles, for the image of stage `target`
// (default: the last stage); returns the parsed stages.
function checkCommon(name, buildDir, pods, target) {
  const file = path.join(DOCKER, `${name}.Dockerfile`);
  const stages = parseDockerfile(file);
  const build = stages.find((s) => s.name === "build");
  const final = target ? stages.find((s) => s.name === target) : stages[stages.length - 1];
  const label = target ? `${name} (${target})` : name;
  if (!final) {
    report(`${label}: stage exists`, [`no stage ${target}`]);
    return {stages, build, final: {ops: []}};
  }

  const context = [];
  // A `# syntax=` directive makes BuildKit pull that frontend image from a
  // registry before it reads the file: an air-gapped builder cannot.
  const directive = /^#\s*syntax\s*=.*$/m.exec(fs.readFileSync(file, "utf8"));
  if (directive) context.push(`"${directive[0]}" pulls a frontend image at build time`);
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
    const wanted = setupBuildPackages();
    // Not found would check nothing: a failure, not a pass.
    if (!wanted) context.push("scripts/setup.sh has no '# build' ... '# data' package lines");
    for (const p of wanted || []) {
      if (!have.has(p)) context.push(`build stage lacks ${p} (scripts/setup.sh)`);
    }
  }
  if (!target || target === "cpu") {
    report(`${name}: build context, sources and build packages`, context);
  }

  // Files copied from a build stage exist in the local build tree (the CUDA
  // module only in a CUDA build), and the entry point is the copied binary.
  const outputs = [];
  const notes = [];
  let binaryDest;
  // The stage and the ones it is built FROM.
  const chain = [];
  for (let s = final; s; s = stages.find((x) => x.name === s.from)) chain.unshift(s);
  for (const stage of chain) {
    for (const {op, args} of stage.ops) {
      if (op !== "COPY") continue;
      const c = parseCopy(args);
      const from = stages.find((x) => x.name === c.from);
      if (!from || !["build", "cuda-build"].includes(from.name)) continue;
      for (const src of c.sources) {
        if (!src.startsWith("/src/build/")) continue;
        const local = path.join(buildDir, src.slice("/src/build/".length));
        const cmakeTarget = path.basename(src).replace(/^lib(.*)\.so$/, "$1");
        if (!fs.existsSync(local)) {
          if (from.name === "cuda-build") {
            notes.push(`${path.basename(src)} not built here (no CUDA build)`);
          } else {
            outputs.push(`${src}: ${local} does not exist`);
          }
        }
        const built = from.ops.some((o) => o.op === "RUN" &&
                                           o.args.includes(`--target ${cmakeTarget}`));
        if (!built) outputs.push(`${src}: no cmake --build --target ${cmakeTarget} in ${from.name}`);
        if (cmakeTarget === name) binaryDest = c.dest;
      }
    }
  }
  const entry = chain.flatMap((s) => s.ops).filter((o) => o.op === "ENTRYPOINT").pop();
  if (!binaryDest) outputs.push(`the final stage copies no ${name} binary`);
  if (!entry || JSON.stringify(JSON.parse(entry.args)) !==
                    JSON.stringify([binaryDest])) {
    outputs.push(`ENTRYPOINT ${entry?.args} is not ["${binaryDest}"]`);
  }
  report(`${label}: build outputs exist in ${path.relative(REPO, buildDir) || "."}` +
         ` and ENTRYPOINT runs the binary${notes.length ? ` (${notes.join("; ")})` : ""}`,
         outputs);

  // Non-root, the manifests' uid/gid and ports.
  const agree = [];
  const user = chain.flatMap((s) => s.ops).filter((o) => o.op === "USER").pop();
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
    const exposed = chain.flatMap((s) => s.ops).filter((o) => o.op === "EXPOSE")
                        .flatMap((o) => o.args.split(" ").map(Number))
                        .sort((a, b) => a - b);
    if (JSON.stringify(exposed) !== JSON.stringify(pods[name].ports)) {
      agree.push(`EXPOSE ${exposed} != containerPorts ${pods[name].ports}`);
    }
  }
  report(`${label}: non-root USER, ports and uid agree with deploy/k8s`, agree);
  return {stages, build, final};
}

// The image of `stage` installs exactly the Debian packages of the
// libraries `binary` links, and the binary runs with only those (and the
// base image's) in a chroot.
function checkRuntimePackages(name, binary, stage, label) {
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
  const listed = new Set(aptPackages(stage));
  for (const p of need) {
    if (!listed.has(p)) errors.push(`runtime stage lacks ${p} (${name} links it)`);
  }
  for (const p of listed) {
    if (!need.has(p)) errors.push(`runtime stage installs ${p}, which ${name} does not link`);
  }
  report(`${label}: runtime packages are exactly those of its libraries ` +
         `(${[...listed].sort().join(" ")})`, errors);

  const run = [];
  const root = fs.mkdtempSync(path.join(os.tmpdir(), `${name}-root-`));
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
        if (/\.so(\.|$)/.test(f) && fs.existsSync(f) && fs.statSync(f).isFile()) {
          place(root, f, path.join("/usr/lib/dp", path.basename(f)));
        }
      }
    }
    place(root, binary, `/usr/local/bin/${name}`);
    for (const argv of [["--version"], ["--dry_run", ...(name === "dp-worker" ? ["--rank=0"] : [])]]) {
      const r = runChrooted(root, "/usr/lib/dp", [`/usr/local/bin/${name}`, ...argv]);
      if (r.code !== 0) run.push(`${name} ${argv.join(" ")} in the chroot exited ${r.code}: ${r.output}`);
    }
  } catch (e) {
    run.push(String(e.message));
  } finally {
    fs.rmSync(root, {recursive: true, force: true});
  }
  report(`${label}: runs with only the base libraries and the runtime packages`, run);
}

function checkDpPs(buildDir, pods) {
  const {final} = checkCommon("dp-ps", buildDir, pods);
  checkRuntimePackages("dp-ps", path.join(buildDir, "server/dp-ps"), final, "dp-ps");
}

function checkDpWorker(buildDir, pods) {
  const {stages, final: cpu} = checkCommon("dp-worker", buildDir, pods, "cpu");
  const {final: gpu} = checkCommon("dp-worker", buildDir, pods, "gpu");
  const errors = [];
  // The cpu image: plain Debian, nothing of CUDA.
  if (cpu.from !== "debian:12-slim") errors.push(`cpu stage FROM ${cpu.from}: want debian:12-slim`);
  for (const s of stages) {
    if (/nvidia\/cuda/.test(s.from)) errors.push(`stage ${s.name} is FROM ${s.from}: no CUDA images`);
  }
  if (aptPackages(cpu).some((p) => /cuda|cublas|nvidia/.test(p))) {
    errors.push("the cpu stage installs CUDA packages");
  }
  // The data set lands at the binary's default --data_dir.
  const header = fs.readFileSync(path.join(REPO, "common/dataset.h"), "utf8");
  const dataDir = /kDefaultFashionMnistDir\[\] =\s*"([^"]+)"/.exec(header)?.[1];
  const dataCopy = cpu.ops.map((o) => o.op === "COPY" && parseCopy(o.args))
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
  report("dp-worker (cpu): debian:12-slim without CUDA, data at the default --data_dir",
         errors);
  checkRuntimePackages("dp-worker", path.join(buildDir, "worker/dp-worker"), cpu,
                       "dp-worker (cpu)");

  // The gpu image: the cpu image, the module where dp-worker loads it, and
  // the CUDA runtime packages of the module's CUDA version, nothing more.
  const g = [];
  if (gpu.from !== "cpu") g.push(`gpu stage FROM ${gpu.from}: want the cpu stage`);
  const cudaBuild = stages.find((s) => s.name === "cuda-build");
  const nvcc = cudaBuild && aptPackages(cudaBuild).find((p) => p.startsWith("cuda-nvcc-"));
  const version = nvcc && /^cuda-nvcc-(\d+)-(\d+)$/.exec(nvcc);
  if (!version || version[1] !== "13") g.push(`cuda-build stage: want cuda-nvcc-13-*, got ${nvcc}`);
  const runtime = aptPackages(gpu).filter((p) => !["ca-certificates", "curl"].includes(p));
  const want = version ? [`cuda-cudart-${version[1]}-${version[2]}`,
                          `libcublas-${version[1]}-${version[2]}`] : [];
  if (JSON.stringify(runtime.sort()) !== JSON.stringify(want.sort())) {
    g.push(`gpu stage installs ${runtime.join(" ")}; want exactly ${want.join(" ")} ` +
           "(cudart, cuBLAS and cuBLASLt of the module's CUDA version)");
  }
  const module = gpu.ops.map((o) => o.op === "COPY" && parseCopy(o.args))
                     .find((c) => c && c.from === "cuda-build");
  if (!module || module.dest !== "/usr/local/lib/dp-ps/libdp_cuda.so" ||
      module.sources[0] !== "/src/build/worker/libdp_cuda.so") {
    g.push("the gpu stage does not copy build/worker/libdp_cuda.so to " +
           "/usr/local/lib/dp-ps/libdp_cuda.so");
  }
  const env = gpu.ops.filter((o) => o.op === "ENV").map((o) => o.args).join(" ");
  if (!/NVIDIA_REQUIRE_CUDA="cuda>=13\.0"/.test(env)) {
    g.push("the gpu stage does not require a CUDA 13 driver (NVIDIA_REQUIRE_CUDA)");
  }
  if (!/NVIDIA_DRIVER_CAPABILITIES=compute,utility/.test(env)) {
    g.push("the gpu stage does not ask for the compute driver capability");
  }
  if (!/NVIDIA_VISIBLE_DEVICES=void\b/.test(env)) {
    g.push("the gpu stage must set NVIDIA_VISIBLE_DEVICES=void: the GPUs a container " +
           "sees come from its GPU request (\"all\" shows a pod without a GPU limit " +
           "every GPU of its node)");
  }
  report("dp-worker (gpu): the cpu image + libdp_cuda.so + CUDA 13 cudart/cuBLAS only", g);
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
