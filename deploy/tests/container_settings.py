#!/usr/bin/env python3
"""What the Kubernetes manifests give a container, compared with what a
container engine ran: scripts/container-check.sh renders an overlay
(`kubectl kustomize`) and hands this the rendered YAML and `podman
inspect` of a running container.

  container_settings.py probes  RENDERED CONTAINER
      one line per gRPC probe the manifests declare: "kind port service"
  container_settings.py port    RENDERED CONTAINER PORT_NAME
      the containerPort of that name
  container_settings.py compare RENDERED CONTAINER INSPECT_JSON [--index N]
      every difference in user, read-only root, capabilities, privilege
      escalation, CPU and memory limits, mounts and DP_* environment (the
      pod's ConfigMaps and env, $(VAR) resolved as the kubelet does, pod
      index N); exit 1 when there is one
"""

import json
import re
import sys

import yaml


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def pod_of(docs, container):
    """(pod spec, container spec) of the workload running `container`."""
    for d in docs:
        spec = d.get("spec", {})
        # StatefulSet and Job: spec.template; JobSet not needed here.
        pod = spec.get("template", {}).get("spec")
        for c in (pod or {}).get("containers", []):
            if c["name"] == container:
                return pod, c
    raise SystemExit(f"no container {container!r} in the rendered manifests")


def config_maps(docs):
    return {d["metadata"]["name"]: d.get("data", {})
            for d in docs if d.get("kind") == "ConfigMap"}


def expected_env(docs, c, index):
    """The container's environment as the kubelet builds it."""
    maps = config_maps(docs)
    env = {}
    for src in c.get("envFrom", []):
        env.update(maps[src["configMapRef"]["name"]])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)",
                                    lambda m: env.get(m.group(1), m.group(0)),
                                    e["value"])
            continue
        ref = e.get("valueFrom", {})
        if "configMapKeyRef" in ref:
            k = ref["configMapKeyRef"]
            env[e["name"]] = maps[k["name"]][k["key"]]
        elif "fieldRef" in ref and "pod-index" in ref["fieldRef"]["fieldPath"]:
            env[e["name"]] = str(index)
    return env


def quantity(q):
    """A Kubernetes quantity (cpu "1", "250m"; memory "512Mi", "1Gi")."""
    q = str(q)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3,
             "M": 1e6, "G": 1e9}
    for u, f in units.items():
        if q.endswith(u):
            return float(q[:-len(u)]) * f
    return float(q)


def compare(docs, container, inspect, index):
    pod, c = pod_of(docs, container)
    got = inspect[0] if isinstance(inspect, list) else inspect
    host = got["HostConfig"]
    problems = []
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    want_user = f"{psc.get('runAsUser')}:{psc.get('runAsGroup')}"
    if got["Config"].get("User") != want_user:
        problems.append(f"user {got['Config'].get('User')!r}, manifests: {want_user}")
    if csc.get("readOnlyRootFilesystem") and not host.get("ReadonlyRootfs"):
        problems.append("root filesystem writable, manifests: read-only")
    if "ALL" in csc.get("capabilities", {}).get("drop", []):
        caps = got.get("EffectiveCaps") or []
        if caps:
            problems.append(f"capabilities {caps}, manifests: drop ALL")
    if csc.get("allowPrivilegeEscalation") is False and not any(
            o.startswith("no-new-privileges") for o in host.get("SecurityOpt") or []):
        problems.append("privilege escalation allowed, manifests: no")
    limits = c.get("resources", {}).get("limits", {})
    if "memory" in limits and host.get("Memory") != quantity(limits["memory"]):
        problems.append(f"memory limit {host.get('Memory')} bytes, "
                        f"manifests: {limits['memory']}")
    if "cpu" in limits:
        period = host.get("CpuPeriod") or 100000
        cpus = (host.get("NanoCpus") or 0) / 1e9 or (host.get("CpuQuota") or 0) / period
        if abs(cpus - quantity(limits["cpu"])) > 1e-6:
            problems.append(f"cpu limit {cpus}, manifests: {limits['cpu']}")
    # Volumes and tmpfs mounts (an emptyDir's counterpart): path -> writable.
    mounts = {m["Destination"]: m.get("RW", True) for m in got.get("Mounts", [])}
    for path, options in (host.get("Tmpfs") or {}).items():
        mounts[path] = "ro" not in options.split(",")
    for m in c.get("volumeMounts", []):
        if m["mountPath"] not in mounts:
            problems.append(f"nothing mounted at {m['mountPath']} "
                            f"(manifests: volume {m['name']})")
        elif not mounts[m["mountPath"]]:
            problems.append(f"{m['mountPath']} mounted read-only")
    env = dict(e.split("=", 1) for e in got["Config"].get("Env", []))
    for k, v in sorted(expected_env(docs, c, index).items()):
        if env.get(k) != v:
            problems.append(f"{k}={env.get(k)!r}, manifests: {v!r}")
    return problems


def main(argv):
    if len(argv) >= 3 and argv[0] == "probes":
        _, c = pod_of(load(argv[1]), argv[2])
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            grpc = c.get(kind, {}).get("grpc")
            if grpc:
                print(kind, grpc["port"], grpc.get("service", '""'))
        return 0
    if len(argv) == 4 and argv[0] == "port":
        _, c = pod_of(load(argv[1]), argv[2])
        for p in c.get("ports", []):
            if p.get("name") == argv[3]:
                print(p["containerPort"])
                return 0
        raise SystemExit(f"{argv[2]} has no port named {argv[3]}")
    if len(argv) >= 4 and argv[0] == "compare":
        index = int(argv[argv.index("--index") + 1]) if "--index" in argv else 0
        with open(argv[3], encoding="utf-8") as f:
            inspect = json.load(f)
        problems = compare(load(argv[1]), argv[2], inspect, index)
        for p in problems:
            print(f"{argv[2]}: {p}")
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
