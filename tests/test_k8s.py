"""The Kubernetes manifests (k8s/) and the image (Dockerfile, .dockerignore), checked offline.

Both overlays are rendered with `kubectl kustomize` and the rendered objects are what every check
reads: built-in kinds validate against the Kubernetes schemas (kubernetes-validate, strict), the
RayCluster against the schema kept in k8s/schemas/, and the consistency checks catch the mistakes
that validation cannot see (a port a Service names that no container has, an environment variable
the code reads that no pod sets, a command line the CLI refuses, a Ray version that differs
between the image and the cluster). Each check returns a list of problems; the tests at the end
break a rendered copy on purpose and expect the check to notice.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
OVERLAYS = ("dev-cpu", "gpu")
# The oldest Kubernetes the manifests support (native gRPC probes are GA in 1.27) and the newest
# that kubernetes-validate knows: a field added later or removed since fails one of them.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
IMAGE = "specdec"  # the image name in the base; overlays only retag it
CUSTOM_SCHEMAS = {("ray.io/v1", "RayCluster"): K8S / "schemas" / "ray.io_v1_RayCluster.json"}
CODE_DIRS = ("specdec", "coordinator", "draft_service", "target_service")

# Every environment variable the code reads (found by grepping CODE_DIRS), and what the manifests
# must do about it: the roles whose containers must set it, or why leaving it unset is right.
# A variable the code starts to read fails test_every_env_var_the_code_reads_is_decided until
# it is listed here. SPECDEC_COORDINATOR_<FLAG> / SPECDEC_DRAFT_<FLAG> are checked against the
# real parsers instead (test_command_lines_are_accepted_by_the_cli).
SPECDEC_ROLES = ("coordinator", "draft", "target-worker", "target-pool")
RAY_ROLES = ("coordinator", "target-head", "target-worker", "target-pool", "target-autoscaler")
ENV_POLICY: dict[str, tuple[str, ...] | str] = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": SPECDEC_ROLES,
    "OTEL_EXPORTER_OTLP_PROTOCOL": SPECDEC_ROLES,
    "OTEL_SERVICE_NAME": SPECDEC_ROLES,
    "OTEL_TRACES_SAMPLER": SPECDEC_ROLES,  # read by the OpenTelemetry SDK, not grepped
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "default: OTEL_EXPORTER_OTLP_ENDPOINT covers traces",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "default: OTEL_EXPORTER_OTLP_PROTOCOL covers traces",
    "OTEL_SDK_DISABLED": "default: unset keeps tracing on",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "default: unset keeps prompts and text out of spans",
    "SPECDEC_CACHE_DIR": SPECDEC_ROLES,  # and on a mounted volume (checked)
    "SPECDEC_TRACE_FILE": "default: the local span file of `specdec up`; in a cluster spans go over OTLP",
    "RAY_AUTH_MODE": RAY_ROLES,
    "RAY_AUTH_TOKEN": RAY_ROLES,  # from a Secret (checked)
    "SPECDEC_COORDINATOR_TLS_CERT": "default: unset serves plaintext; in-cluster traffic stays in the cluster (TLS is for a port exposed outside it)",
    "SPECDEC_COORDINATOR_TLS_KEY": "default: goes with SPECDEC_COORDINATOR_TLS_CERT",
    "SPECDEC_DRAFT_AUTH_TOKEN": "default: unset leaves the draft port open to the cluster network; set it from a Secret to require a token",
    "SPECDEC_COORDINATOR_DRAFT_AUTH_TOKEN": "default: goes with SPECDEC_DRAFT_AUTH_TOKEN (the same Secret)",
}
# Names read directly (os.environ.get("X")), and names kept in constants (X_ENV = "SPECDEC_X").
_ENV_READ = re.compile(r"""(?:environ(?:\.get|\.setdefault|\.pop)?\s*[(\[]|getenv\s*\()\s*["']([A-Z][A-Z0-9_]+)["']""")
_ENV_LITERAL = re.compile(r"""["']((?:SPECDEC|OTEL|RAY|HF)_[A-Z0-9_]*[A-Z0-9])["']""")
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_SECRET_LIKE = re.compile(r"(?:^|_)(?:TOKEN|PASSWORD|SECRET|API_KEY|CREDENTIALS?)(?:_|$)", re.I)


# --- rendering and walking the objects -------------------------------------------------------


@cache
def _render_text(overlay: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH: these tests render k8s/overlays/* with `kubectl kustomize` (kubectl >= 1.14 has kustomize built in)")
    done = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize k8s/overlays/{overlay} failed:\n{done.stderr}"
    return done.stdout


def render(overlay: str) -> list[dict]:
    """The overlay's objects, a fresh copy each call (the tests below may break it)."""
    return [doc for doc in yaml.safe_load_all(_render_text(overlay)) if doc is not None]


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> str:
    return request.param


def find(objs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict], kind: str, name: str) -> dict:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_templates(objs: list[dict]):
    """(owner, role, pod template) for every pod the objects create."""
    for o in objs:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            role = o["spec"]["template"]["metadata"].get("labels", {}).get("app.kubernetes.io/component", name)
            yield o, role, o["spec"]["template"]
        elif kind == "RayCluster":
            yield o, "target-head", o["spec"]["headGroupSpec"]["template"]
            for group in o["spec"].get("workerGroupSpecs", []):
                yield o, "target-worker", group["template"]


def containers(objs: list[dict]):
    """(owner, role, pod template, container) for every container, plus the Ray autoscaler sidecar
    (KubeRay adds it from autoscalerOptions) as a pseudo-container of role target-autoscaler."""
    for owner, role, template in pod_templates(objs):
        for c in template["spec"]["containers"]:
            yield owner, role, template, c
    for rc in find(objs, "RayCluster"):
        options = rc["spec"].get("autoscalerOptions", {})
        if rc["spec"].get("enableInTreeAutoscaling"):
            yield rc, "target-autoscaler", None, {"name": "autoscaler", "env": options.get("env", []), "envFrom": options.get("envFrom", [])}


def role_containers(objs: list[dict], role: str) -> list[dict]:
    return [c for _, r, _, c in containers(objs) if r == role]


def is_specdec_image(container: dict) -> bool:
    image = container.get("image", "").split("@")[0].rsplit(":", 1)[0]
    return image == IMAGE or image.endswith("/" + IMAGE)


def container_env(objs: list[dict], owner: dict, container: dict) -> dict[str, str]:
    """The environment Kubernetes gives the container: envFrom first, then env in order with
    $(VAR) expanded from what is defined before. Secrets (never in the render) read as
    '<secret NAME/KEY>'; the downward API as the values the pod would get."""
    namespace = owner["metadata"].get("namespace", "default")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is None:
            continue
        maps = find(objs, "ConfigMap", ref["name"])
        if maps:
            env.update({source.get("prefix", "") + k: v for k, v in maps[0].get("data", {}).items()})
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "valueFrom" in var:
            src = var["valueFrom"]
            if "secretKeyRef" in src:
                env[var["name"]] = f"<secret {src['secretKeyRef']['name']}/{src['secretKeyRef']['key']}>"
            elif "configMapKeyRef" in src:
                ref = src["configMapKeyRef"]
                maps = find(objs, "ConfigMap", ref["name"])
                if maps and ref["key"] in maps[0].get("data", {}):
                    env[var["name"]] = maps[0]["data"][ref["key"]]
            elif "fieldRef" in src:
                path = src["fieldRef"]["fieldPath"]
                env[var["name"]] = {"metadata.namespace": namespace, "metadata.name": f"{owner['metadata']['name']}-pod"}.get(path, f"<{path}>")
        else:
            env[var["name"]] = ""
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, the rest stay as written."""
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def command_line(objs: list[dict], owner: dict, container: dict) -> tuple[list[str], dict[str, str]]:
    env = container_env(objs, owner, container)
    return [expand(a, env) for a in container.get("command", []) + container.get("args", [])], env


def quantity(value) -> float:
    text = str(value)
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text)


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --- the real command lines ----------------------------------------------------------------


def _parsers():
    from coordinator.__main__ import _parser as coordinator_parser
    from draft_service.__main__ import _parser as draft_parser
    from target_service.__main__ import _parser as target_parser

    return {"coordinator": coordinator_parser, "draft": draft_parser, "target": lambda environ: target_parser()}


def parse_specdec(argv: list[str], env: dict[str, str]):
    """Parse `specdec ARGV` (the container's args) as the entrypoint would, with the container's
    environment as the environment; returns (subcommand, config-or-namespace) or raises ValueError."""
    from coordinator.__main__ import parse_config as coordinator_config
    from draft_service.__main__ import parse_config as draft_config

    if not argv or argv[0] not in _parsers():
        raise ValueError(f"not a specdec server command line: {argv}")
    sub, rest = argv[0], argv[1:]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            if sub == "coordinator":
                return sub, coordinator_config(rest, env)
            if sub == "draft":
                return sub, draft_config(rest, env)
            return sub, _parsers()["target"](env).parse_args(rest)
    except SystemExit as e:
        raise ValueError(f"specdec {' '.join(argv)}: exit {e.code}: {stderr.getvalue().strip()}") from None


def flags_given(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests of the flags that appear on a command line."""
    by_option = {opt: a.dest for a in parser._actions for opt in a.option_strings}
    return {by_option[arg.split("=")[0]] for arg in argv if arg.split("=")[0] in by_option}


def env_name(prefix: str, action: argparse.Action) -> str:
    return prefix + action.option_strings[0].lstrip("-").upper().replace("-", "_")


ENV_PREFIXES = {"coordinator": "SPECDEC_COORDINATOR_", "draft": "SPECDEC_DRAFT_"}


def specdec_commands(objs: list[dict]):
    """(role, container, argv, env) for every container that runs `specdec <server command>`."""
    for owner, role, _, c in containers(objs):
        if is_specdec_image(c) and c.get("args"):
            argv, env = command_line(objs, owner, c)
            yield role, c, argv, env


def parsed(objs: list[dict], role: str):
    for r, _, argv, env in specdec_commands(objs):
        if r == role:
            return parse_specdec(argv, env)[1]
    raise AssertionError(f"no container of role {role} runs specdec")


# --- checks: each returns a list of problems -----------------------------------------------


def check_builtin_kinds(objs: list[dict], version: str = K8S_VERSIONS[0]) -> list[str]:
    problems = []
    for o in objs:
        if (o["apiVersion"], o["kind"]) in CUSTOM_SCHEMAS:
            continue
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{o['apiVersion']} {o['kind']}: neither a Kubernetes {version} kind nor a schema in k8s/schemas/")
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{o['kind']} {o['metadata'].get('name')}: {e.message} at {'.'.join(map(str, e.path))}")
    # The pod templates inside custom resources are core/v1 PodTemplateSpecs: validate them too.
    for owner, role, template in pod_templates([o for o in objs if (o["apiVersion"], o["kind"]) in CUSTOM_SCHEMAS]):
        wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{owner['metadata']['name']}-{role}"}, "template": template}
        try:
            kubernetes_validate.validate(wrapper, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{owner['kind']} {owner['metadata']['name']} ({role}) pod template: {e.message} at {'.'.join(map(str, e.path))}")
    return problems


def check_custom_resources(objs: list[dict]) -> list[str]:
    problems = []
    for o in objs:
        path = CUSTOM_SCHEMAS.get((o["apiVersion"], o["kind"]))
        if path is None:
            continue
        schema = json.loads(path.read_text())
        validator = jsonschema.Draft202012Validator(schema)
        for error in sorted(validator.iter_errors(o), key=lambda e: list(e.absolute_path)):
            problems.append(f"{o['kind']} {o['metadata'].get('name')}: {error.message} at {'/'.join(map(str, error.absolute_path))}")
    return problems


def check_references(objs: list[dict]) -> list[str]:
    """Every ConfigMap a pod names is rendered (kustomize renames generated ones: a name it does
    not rewrite, as in a custom resource it was not taught about, is a dangling reference)."""
    problems = []
    maps = {o["metadata"]["name"] for o in find(objs, "ConfigMap")}
    for owner, role, template, c in containers(objs):
        for source in c.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref and ref["name"] not in maps and not ref.get("optional"):
                problems.append(f"{role}/{c['name']}: envFrom names ConfigMap {ref['name']}, which is not rendered")
        for var in c.get("env", []):
            ref = var.get("valueFrom", {}).get("configMapKeyRef")
            if ref and ref["name"] not in maps:
                problems.append(f"{role}/{c['name']}: {var['name']} names ConfigMap {ref['name']}, which is not rendered")
        for volume in (template or {}).get("spec", {}).get("volumes", []):
            if "configMap" in volume and volume["configMap"]["name"] not in maps:
                problems.append(f"{role}: volume {volume['name']} names ConfigMap {volume['configMap']['name']}, which is not rendered")
    return problems


def check_ports(objs: list[dict]) -> list[str]:
    """Every port a Service, a probe or a scrape annotation names exists on the container."""
    problems = []
    templates = list(pod_templates(objs))

    def has_port(template: dict, port) -> bool:
        return any(p.get("name") == port or p["containerPort"] == port for c in template["spec"]["containers"] for p in c.get("ports", []))

    for svc in find(objs, "Service"):
        selected = [t for o, _, t in templates if o["metadata"].get("namespace") == svc["metadata"].get("namespace") and labels_match(svc["spec"].get("selector", {}), t["metadata"].get("labels", {}))]
        if not selected:
            problems.append(f"Service {svc['metadata']['name']}: its selector matches no pod template")
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for t in selected:
                if not has_port(t, target):
                    problems.append(f"Service {svc['metadata']['name']} port {port.get('name')}: targetPort {target} is not a container port of the pods it selects")
    for owner, role, template in templates:
        for c in template["spec"]["containers"]:
            names = {p.get("name") for p in c.get("ports", [])}
            numbers = {p["containerPort"] for p in c.get("ports", [])}
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(kind)
                if not probe:
                    continue
                for handler in ("grpc", "httpGet", "tcpSocket"):
                    if handler in probe:
                        port = probe[handler]["port"]
                        if port not in names and port not in numbers:
                            problems.append(f"{role}/{c['name']} {kind}: port {port} is not a container port")
        annotations = template["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            port = int(annotations.get("prometheus.io/port", "0"))
            if not has_port(template, port):
                problems.append(f"{role}: prometheus.io/port {port} is not a container port")
    return problems


def check_env(objs: list[dict]) -> list[str]:
    """Every variable ENV_POLICY requires is set where it must be; the cache is on a volume; the
    Ray token comes from one Secret; no $(VAR) is left unexpanded; every SPECDEC_COORDINATOR_* /
    SPECDEC_DRAFT_* variable names a real flag."""
    problems = []
    parsers = _parsers()
    flag_envs = {prefix: {env_name(prefix, a) for a in parsers[role]({})._actions if a.option_strings and a.dest != "help"} for role, prefix in ENV_PREFIXES.items()}
    token_refs = set()
    for owner, role, _, c in containers(objs):
        env = container_env(objs, owner, c)
        for name, roles in ENV_POLICY.items():
            if isinstance(roles, tuple) and role in roles and not env.get(name):
                problems.append(f"{role}/{c['name']}: {name} is not set")
        for name, value in env.items():
            if _VAR_REF.search(value):
                problems.append(f"{role}/{c['name']}: {name}={value} refers to a variable that is not defined before it")
            for prefix, known in flag_envs.items():
                if name.startswith(prefix) and name not in known:
                    problems.append(f"{role}/{c['name']}: {name} is set but `specdec {prefix.split('_')[1].lower()}` has no such flag (it would be ignored)")
        if role in ENV_POLICY["SPECDEC_CACHE_DIR"] and env.get("SPECDEC_CACHE_DIR"):
            mounts = [m["mountPath"].rstrip("/") for m in c.get("volumeMounts", [])]
            cache_dir = env["SPECDEC_CACHE_DIR"].rstrip("/")
            if not any(cache_dir == m or cache_dir.startswith(m + "/") for m in mounts):
                problems.append(f"{role}/{c['name']}: SPECDEC_CACHE_DIR={cache_dir} is not on a mounted volume")
        if role in RAY_ROLES:
            if env.get("RAY_AUTH_MODE") != "token":
                problems.append(f"{role}/{c['name']}: RAY_AUTH_MODE must be 'token' (explicit, the same in every Ray process)")
            refs = [v["valueFrom"]["secretKeyRef"] for v in c.get("env", []) if v["name"] == "RAY_AUTH_TOKEN" and "secretKeyRef" in v.get("valueFrom", {})]
            if not refs or refs[0].get("optional"):
                problems.append(f"{role}/{c['name']}: RAY_AUTH_TOKEN must come from a (required) Secret")
            token_refs.update((r["name"], r["key"]) for r in refs)
    if len(token_refs) > 1:
        problems.append(f"RAY_AUTH_TOKEN comes from different Secrets: {sorted(token_refs)}")
    return problems


def check_secrets(objs: list[dict]) -> list[str]:
    """Secrets only by reference: none is rendered, and no secret-like variable has a literal value."""
    problems = [f"Secret {o['metadata']['name']} is in the manifests (create it in the cluster, reference it)" for o in find(objs, "Secret")]
    for owner, role, _, c in containers(objs):
        for var in c.get("env", []):
            if _SECRET_LIKE.search(var["name"]) and "value" in var:
                problems.append(f"{role}/{c['name']}: {var['name']} has a literal value; use a secretKeyRef")
    for cm in find(objs, "ConfigMap"):
        for key in cm.get("data", {}):
            if _SECRET_LIKE.search(key):
                problems.append(f"ConfigMap {cm['metadata']['name']}: {key} looks like a secret")
    return problems


def check_command_lines(objs: list[dict]) -> list[str]:
    """Every specdec command line parses with the real parser and the container's environment; no
    flag is both on the command line and in the environment (the environment would be ignored)."""
    problems = []
    parsers = _parsers()
    roles_seen = set()
    for role, c, argv, env in specdec_commands(objs):
        roles_seen.add(argv[0] if argv else "")
        for arg in argv:
            if _VAR_REF.search(arg):
                problems.append(f"{role}/{c['name']}: argument {arg} refers to a variable the container does not define")
        try:
            sub, _ = parse_specdec(argv, env)
        except ValueError as e:
            problems.append(f"{role}/{c['name']}: {e}")
            continue
        if sub in ENV_PREFIXES:
            parser = parsers[sub](env)
            for dest in flags_given(parser, argv[1:]):
                action = next(a for a in parser._actions if a.dest == dest)
                name = env_name(ENV_PREFIXES[sub], action)
                if name in env:
                    problems.append(f"{role}/{c['name']}: {action.option_strings[0]} is on the command line and {name} in the environment")
    for sub in ("coordinator", "draft", "target"):
        if sub not in roles_seen:
            problems.append(f"no container runs `specdec {sub}`")
    return problems


def check_wiring(objs: list[dict]) -> list[str]:
    """The addresses and numbers that the parts must agree on, read from the parsed configs."""
    problems = []
    coordinator, draft, pool = parsed(objs, "coordinator"), parsed(objs, "draft"), parsed(objs, "target-pool")
    ray_clusters = find(objs, "RayCluster")
    (coordinator_c,) = role_containers(objs, "coordinator")
    (draft_c,) = role_containers(objs, "draft")
    coordinator_ns = one(objs, "Deployment", "specdec-coordinator")["metadata"].get("namespace")

    def service_port(name: str, namespace: str, port: int) -> dict | None:
        for svc in find(objs, "Service", name):
            if svc["metadata"].get("namespace") == namespace:
                return next((p for p in svc["spec"]["ports"] if p["port"] == port), None)
        return None

    # coordinator -> draft: a headless Service by DNS, to the port the draft serves on.
    m = re.fullmatch(r"dns:///([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", coordinator.draft)
    if not m:
        problems.append(f"coordinator --draft {coordinator.draft}: expected dns:///SERVICE.NAMESPACE.svc.cluster.local:PORT")
    else:
        svc_name, ns, port = m.group(1), m.group(2), int(m.group(3))
        port_spec = service_port(svc_name, ns, port)
        if port_spec is None:
            problems.append(f"coordinator --draft: no Service {svc_name} in {ns} with port {port}")
        else:
            svc = one(objs, "Service", svc_name)
            if svc["spec"].get("clusterIP") != "None":
                problems.append(f"Service {svc_name} must be headless (clusterIP: None) for the draft client to see every replica")
            target = port_spec.get("targetPort", port)
            numbers = {p["containerPort"] for p in draft_c["ports"] if target in (p.get("name"), p["containerPort"])}
            if numbers != {draft.port}:
                problems.append(f"Service {svc_name} sends port {port} to container port {numbers}, the draft listens on {draft.port}")
    # coordinator and pool Job -> Ray head's client port; both name the same pool.
    for who, address in (("coordinator --ray-address", coordinator.ray_address), ("target-pool --address", pool.address)):
        m = re.fullmatch(r"ray://([a-z0-9-]+)-head-svc\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", address or "")
        clusters = [rc for rc in ray_clusters if m and rc["metadata"]["name"] == m.group(1) and rc["metadata"].get("namespace") == m.group(2)]
        if not clusters:
            problems.append(f"{who} {address}: expected ray://RAYCLUSTER-head-svc.NAMESPACE.svc.cluster.local:PORT of a rendered RayCluster")
            continue
        head = clusters[0]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        if int(m.group(3)) not in {p["containerPort"] for p in head.get("ports", [])}:
            problems.append(f"{who}: port {m.group(3)} is not a port of the Ray head")
        if m.group(2) != coordinator_ns:
            problems.append(f"{who}: namespace {m.group(2)} is not the deployment's ({coordinator_ns})")
    if (pool.name, pool.namespace) != (coordinator.target_pool, coordinator.namespace):
        problems.append(f"the Job creates pool {pool.name} in Ray namespace {pool.namespace}; the coordinator looks for {coordinator.target_pool} in {coordinator.namespace}")
    # Draft length: the coordinator may not ask the draft for more than it serves.
    if coordinator.engine.max_draft_tokens > draft.draft.max_draft_tokens:
        problems.append(f"coordinator max-draft-tokens {coordinator.engine.max_draft_tokens} > draft max-draft-tokens {draft.draft.max_draft_tokens}")
    # Metrics: bound on all interfaces, on the port the scrape annotation names.
    for role, host, port in (("coordinator", coordinator.server.host, coordinator.metrics_port), ("draft", draft.host, draft.metrics_port), ("target-worker", pool.metrics_host, pool.metrics_port)):
        if host != "0.0.0.0":
            problems.append(f"{role}: metrics bind to {host}, not reachable by Prometheus (0.0.0.0)")
        for _, r, template in pod_templates(objs):
            if r == role and template["metadata"].get("annotations", {}).get("prometheus.io/port") != str(port):
                problems.append(f"{role}: prometheus.io/port is {template['metadata'].get('annotations', {}).get('prometheus.io/port')}, metrics are on {port}")
    # gRPC probes: on the serving port; a named service must be a real one.
    services = _grpc_service_names()
    for role, container, config_port in (("coordinator", coordinator_c, coordinator.server.port), ("draft", draft_c, draft.port)):
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind, {})
            if "grpc" not in probe:
                problems.append(f"{role}: {kind} must be a native grpc probe on the health service")
                continue
            if probe["grpc"]["port"] != config_port:
                problems.append(f"{role}: {kind} probes port {probe['grpc']['port']}, the server is on {config_port}")
            if probe["grpc"].get("service", "") not in services | {""}:
                problems.append(f"{role}: {kind} asks about service {probe['grpc']['service']!r}, not one the server registers")
    # Draining: the pod is given drain + grace, and liveness never fires during it.
    for role, owner_name, container, drain_s in (("coordinator", "specdec-coordinator", coordinator_c, coordinator.server.grace_s), ("draft", "specdec-draft", draft_c, draft.drain_delay_s + draft.grace_s)):
        spec = one(objs, "Deployment", owner_name)["spec"]["template"]["spec"]
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        pre_stop_s = float(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0.0
        budget = spec.get("terminationGracePeriodSeconds", 30)
        if budget <= pre_stop_s + drain_s:
            problems.append(f"{role}: terminationGracePeriodSeconds {budget} <= preStop {pre_stop_s} + drain/grace {drain_s}")
        live = container.get("livenessProbe", {})
        if live.get("periodSeconds", 10) * live.get("failureThreshold", 3) <= pre_stop_s + drain_s:
            problems.append(f"{role}: liveness would kill a draining pod (period x threshold <= {pre_stop_s + drain_s} s)")
    return problems


def check_target_tier(objs: list[dict], overlay: str) -> list[str]:
    """One target actor per Ray worker pod (so the worker group's replicas are the pool's size),
    no work on the head, a pool that fits the group, GPUs exactly where the overlay says."""
    problems = []
    pool = parsed(objs, "target-pool")
    (rc,) = find(objs, "RayCluster")
    spec = rc["spec"]
    if spec["headGroupSpec"]["rayStartParams"].get("num-cpus") != "0":
        problems.append("Ray head: rayStartParams num-cpus must be \"0\" (no work scheduled on it)")
    if not spec.get("enableInTreeAutoscaling"):
        problems.append("RayCluster: enableInTreeAutoscaling must be on (the pool Job scales the worker group)")
    # KubeRay treats the Ray container's port named "metrics" as Ray's own exporter.
    for name, group in [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]:
        ray_container = group["template"]["spec"]["containers"][0]
        metrics = [p["containerPort"] for p in ray_container.get("ports", []) if p.get("name") == "metrics"]
        if metrics != [int(group["rayStartParams"].get("metrics-export-port", "8080"))]:
            problems.append(f"Ray {name}: the port named metrics ({metrics}) is not Ray's metrics-export-port")
    for group in spec["workerGroupSpecs"]:
        cpus = int(group["rayStartParams"].get("num-cpus", "0"))
        worker = group["template"]["spec"]["containers"][0]
        if not pool.cpus_per_actor or not pool.cpus_per_actor <= cpus < 2 * pool.cpus_per_actor:
            problems.append(f"worker group {group['groupName']}: num-cpus {cpus} with --cpus-per-actor {pool.cpus_per_actor} is not one actor per pod")
        if quantity(worker["resources"]["requests"]["cpu"]) < cpus:
            problems.append(f"worker group {group['groupName']}: num-cpus {cpus} exceeds the pod's CPU request")
        if not group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"]:
            problems.append(f"worker group {group['groupName']}: replicas outside [minReplicas, maxReplicas]")
        if pool.replicas > group["maxReplicas"]:
            problems.append(f"the pool asks for {pool.replicas} actors; worker group {group['groupName']} stops at {group['maxReplicas']} pods")
        gpus = worker.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if overlay == "gpu" and not (gpus and int(gpus) >= 1):
            problems.append(f"gpu overlay: worker group {group['groupName']} has no nvidia.com/gpu limit")
    if overlay == "dev-cpu":
        for _, role, _, c in containers(objs):
            if "nvidia.com/gpu" in json.dumps(c.get("resources", {})):
                problems.append(f"dev-cpu overlay: {role}/{c['name']} asks for a GPU")
    return problems


def check_autoscaling(objs: list[dict]) -> list[str]:
    problems = []
    for hpa in find(objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        targets = find(objs, ref["kind"], ref["name"])
        if not targets:
            problems.append(f"HPA {hpa['metadata']['name']}: no {ref['kind']} {ref['name']}")
            continue
        if "replicas" in targets[0]["spec"]:
            problems.append(f"{ref['kind']} {ref['name']}: spec.replicas is set, and every apply would undo the HPA")
        if hpa["spec"].get("minReplicas", 1) > hpa["spec"]["maxReplicas"]:
            problems.append(f"HPA {hpa['metadata']['name']}: minReplicas > maxReplicas")
        for metric in hpa["spec"].get("metrics", []):
            name = metric.get("resource", {}).get("name")
            if name and any(name not in c.get("resources", {}).get("requests", {}) for c in targets[0]["spec"]["template"]["spec"]["containers"]):
                problems.append(f"HPA {hpa['metadata']['name']} scales on {name} utilization, but a container has no {name} request")
    for pdb in find(objs, "PodDisruptionBudget"):
        if not any(labels_match(pdb["spec"]["selector"]["matchLabels"], t["metadata"].get("labels", {})) for _, _, t in pod_templates(objs)):
            problems.append(f"PodDisruptionBudget {pdb['metadata']['name']}: its selector matches no pods")
    if not any(labels_match(p["spec"]["selector"]["matchLabels"], one(objs, "Deployment", "specdec-coordinator")["spec"]["template"]["metadata"]["labels"]) for p in find(objs, "PodDisruptionBudget")):
        problems.append("the coordinator has no PodDisruptionBudget")
    return problems


def check_tracing(objs: list[dict]) -> list[str]:
    """OTLP from every role reaches the collector's receiver, and the collector's pipeline is
    complete and exports to the Jaeger Service."""
    problems = []
    (coordinator_owner,) = [o for o, r, _, _ in containers(objs) if r == "coordinator"]
    env = container_env(objs, coordinator_owner, role_containers(objs, "coordinator")[0])
    m = re.fullmatch(r"https?://([a-z0-9-]+):(\d+)", env.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
    (cm,) = [c for c in find(objs, "ConfigMap") if "otel-collector.yaml" in c.get("data", {})]
    config = yaml.safe_load(cm["data"]["otel-collector.yaml"])
    if not m:
        return [f"OTEL_EXPORTER_OTLP_ENDPOINT {env.get('OTEL_EXPORTER_OTLP_ENDPOINT')!r} is not http(s)://SERVICE:PORT"]
    svc_name, port = m.group(1), int(m.group(2))
    svcs = find(objs, "Service", svc_name)
    protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc").split("/")[0]
    receiver = config.get("receivers", {}).get("otlp", {}).get("protocols", {}).get("grpc" if protocol == "grpc" else "http", {})
    receiver_port = int(receiver.get("endpoint", ":-1").rsplit(":", 1)[1])
    if not svcs:
        problems.append(f"OTEL_EXPORTER_OTLP_ENDPOINT names Service {svc_name}, which is not rendered")
    else:
        port_spec = next((p for p in svcs[0]["spec"]["ports"] if p["port"] == port), None)
        collectors = [t for _, _, t in pod_templates(objs) if labels_match(svcs[0]["spec"]["selector"], t["metadata"].get("labels", {}))]
        container_ports = [p for t in collectors for c in t["spec"]["containers"] for p in c.get("ports", []) if port_spec and port_spec.get("targetPort") in (p.get("name"), p["containerPort"])]
        if not port_spec or [p["containerPort"] for p in container_ports] != [receiver_port]:
            problems.append(f"OTLP {protocol} to {svc_name}:{port} does not reach the collector's {protocol} receiver on :{receiver_port}")
    pipeline = config.get("service", {}).get("pipelines", {}).get("traces", {})
    for section in ("receivers", "processors", "exporters"):
        for name in pipeline.get(section, []):
            if name not in config.get(section, {}):
                problems.append(f"collector: the traces pipeline uses {section[:-1]} {name}, which is not defined")
    for name in config.get("service", {}).get("extensions", []):
        if name not in config.get("extensions", {}):
            problems.append(f"collector: extension {name} is enabled but not defined")
    for name in pipeline.get("exporters", []):
        endpoint = config["exporters"].get(name, {}).get("endpoint", "")
        host, _, port_text = endpoint.rpartition(":")
        jaeger = find(objs, "Service", host)
        if not jaeger or int(port_text) not in {p["port"] for p in jaeger[0]["spec"]["ports"]}:
            problems.append(f"collector exporter {name}: {endpoint} is not a rendered Service port")
    return problems


def check_ray_versions(objs: list[dict]) -> list[str]:
    """Ray refuses clients and nodes of another version: the image's Ray is the cluster's."""
    image_ray = dockerfile_args()["RAY_VERSION"]
    return [f"RayCluster {rc['metadata']['name']}: rayVersion {rc['spec'].get('rayVersion')} != the image's ray {image_ray}" for rc in find(objs, "RayCluster") if rc["spec"].get("rayVersion") != image_ray]


@cache
def _grpc_service_names() -> frozenset[str]:
    from specdec.v1 import draft_pb2, generation_pb2

    return frozenset(s.full_name for m in (draft_pb2, generation_pb2) for s in m.DESCRIPTOR.services_by_name.values())


# --- the image -------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "") for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")]


def dockerfile_args() -> dict[str, str]:
    return dict(arg.split("=", 1) for op, arg in dockerfile_instructions() if op == "ARG" and "=" in arg)


def _glob_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as Docker reads it (Go filepath.Match, plus ** for any depth)."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        rules.append((keep, _glob_regex(os.path.normpath(line.lstrip("!").strip()).lstrip("/"))))
    return rules


def in_build_context(path: str, rules) -> bool:
    """Docker's rule: a pattern that matches the path or one of its parent directories decides;
    the last such pattern wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for keep, rx in rules:
        if any(rx.fullmatch(c) for c in candidates):
            included = keep
    return included


# --- tests -----------------------------------------------------------------------------------


def test_every_manifest_parses_and_both_overlays_render(overlay):
    for path in sorted(K8S.rglob("*")):
        if path.suffix in (".yaml", ".yml"):
            docs = list(yaml.safe_load_all(path.read_text()))
            assert docs and all(isinstance(d, (dict, list)) for d in docs if d is not None), path
        elif path.suffix == ".json":
            jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))
    objs = render(overlay)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for expected in [
        ("Deployment", "specdec-draft"), ("Service", "specdec-draft"), ("HorizontalPodAutoscaler", "specdec-draft"),
        ("RayCluster", "specdec-target"), ("Job", "specdec-target-pool"),
        ("Deployment", "specdec-coordinator"), ("Service", "specdec-coordinator"),
        ("HorizontalPodAutoscaler", "specdec-coordinator"), ("PodDisruptionBudget", "specdec-coordinator"),
        ("Deployment", "specdec-otel-collector"), ("Service", "specdec-otel-collector"),
        ("Deployment", "specdec-jaeger"), ("Service", "specdec-jaeger"),
    ]:
        assert expected in kinds, f"{overlay}: {expected} is missing"
    config_maps = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specdec-config")]
    assert len(config_maps) == 1, "one ConfigMap holds specdec's configuration"
    namespaces = {o["metadata"].get("namespace") for o in objs}
    assert len(namespaces) == 1 and None not in namespaces, f"{overlay}: every object in the overlay's namespace, got {namespaces}"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_kinds_validate_strictly(overlay, version):
    assert check_builtin_kinds(render(overlay), version) == []


def test_custom_resources_validate_against_the_repo_schemas(overlay):
    objs = render(overlay)
    assert find(objs, "RayCluster"), "the RayCluster is rendered"
    assert check_custom_resources(objs) == []


def test_references_and_secrets(overlay):
    objs = render(overlay)
    assert check_references(objs) == []
    assert check_secrets(objs) == []


def test_named_ports_exist(overlay):
    assert check_ports(render(overlay)) == []


def test_every_env_var_the_code_reads_is_decided():
    read = set()
    for folder in CODE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            read |= set(_ENV_READ.findall(text)) | set(_ENV_LITERAL.findall(text))
    undecided = sorted(read - set(ENV_POLICY))
    assert not undecided, f"the code reads {undecided}: add each to ENV_POLICY in tests/test_k8s.py (which roles must set it, or why its default is right) and set it in k8s/"
    assert {"SPECDEC_CACHE_DIR", "RAY_AUTH_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT"} <= read, "the grep still finds the variables it should"


def test_env_vars_are_set_where_the_code_reads_them(overlay):
    assert check_env(render(overlay)) == []


def test_command_lines_are_accepted_by_the_cli(overlay):
    objs = render(overlay)
    assert check_command_lines(objs) == []
    # And through the entrypoint itself: `specdec <args> --help` with the container's environment.
    from specdec import cli

    for role, c, argv, env in specdec_commands(objs):
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as exit_:
                cli.main(argv + ["--help"])
        finally:
            os.environ.clear()
            os.environ.update(saved)
        assert exit_.value.code == 0, f"{role}: specdec {' '.join(argv)} --help: {err.getvalue()}"


def test_parts_are_wired_to_each_other(overlay):
    assert check_wiring(render(overlay)) == []


def test_target_tier_shape(overlay):
    assert check_target_tier(render(overlay), overlay) == []


def test_autoscaling_and_disruption_budgets(overlay):
    assert check_autoscaling(render(overlay)) == []


def test_traces_reach_jaeger(overlay):
    assert check_tracing(render(overlay)) == []


def test_ray_versions_agree():
    image_ray = dockerfile_args()["RAY_VERSION"]
    installed = importlib.metadata.version("ray")
    assert image_ray == installed, f"the image pins ray {image_ray}, this environment runs {installed}: Ray client and cluster must match"
    declared = next(Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"] if r.startswith("ray"))
    assert declared.specifier.contains(image_ray), f"pyproject asks for {declared}, the image pins {image_ray}"
    for overlay in OVERLAYS:
        objs = render(overlay)
        assert find(objs, "RayCluster") and check_ray_versions(objs) == []


def test_dockerfile_one_image_for_every_role():
    ops = dockerfile_instructions()
    assert [json.loads(arg) for op, arg in ops if op == "ENTRYPOINT"] == [["specdec"]]
    users = [arg for op, arg in ops if op == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) != 0, "the image runs as a numeric non-root user"
    uid = int(users[-1].split(":")[0])
    for overlay in OVERLAYS:
        for _, role, template, c in containers(render(overlay)):
            if template is not None and is_specdec_image(c):
                assert template["spec"]["securityContext"].get("runAsUser") == uid and template["spec"]["securityContext"].get("runAsNonRoot"), f"{overlay} {role}: runs as the image's user {uid}, non-root"
    args = dockerfile_args()
    assert args["VARIANT"] == "cpu"
    run = " ".join(arg for op, arg in ops if op == "RUN")
    assert "cpu)" in run and "cuda)" in run and "$TORCH_CUDA_INDEX" in run, "VARIANT=cpu|cuda selects the torch build"
    # The CPU torch is the one the README and CI install.
    pins = set(re.findall(r"torch==([0-9.]+)", (ROOT / "README.md").read_text() + (ROOT / ".ci" / "run").read_text()))
    assert pins == {args["TORCH_VERSION"]}, f"Dockerfile TORCH_VERSION {args['TORCH_VERSION']}, README/CI pin {pins}"
    # Tags follow the variant in each overlay.
    for overlay, variant in (("dev-cpu", "cpu"), ("gpu", "cuda")):
        tags = {c["image"].rsplit(":", 1)[1] for _, _, _, c in containers(render(overlay)) if is_specdec_image(c)}
        assert tags and all(t.endswith("-" + variant) for t in tags), f"{overlay}: image tags {tags}"


def test_build_context_excludes_tests_caches_and_weights():
    rules = dockerignore()
    for path in ["tests/test_k8s.py", "tests/conftest.py", ".git/HEAD", ".venv/bin/python", ".pytest_cache/v/x", "specdec/__pycache__/cli.cpython-311.pyc", "specdec.egg-info/PKG-INFO", "bench/results/run.json", "models/gemma/model.safetensors", "weights/target.gguf", "specdec/tiny.gguf", "coordinator/x.bin", "checkpoint.pt", ".cache/specdec/converted/model.safetensors", "k8s/base/draft.yaml"]:
        assert not in_build_context(path, rules), f"{path} is in the Docker build context"
    sources = [src for op, arg in dockerfile_instructions() if op == "COPY" for src in arg.split()[:-1] if not src.startswith("--")]
    assert sources, "the Dockerfile copies the project"
    for src in sources:
        assert not src.startswith("tests"), "no tests in the image"
        files = [src] if (ROOT / src).is_file() else [str(p.relative_to(ROOT)) for p in (ROOT / src).rglob("*.py") if "__pycache__" not in p.parts]
        assert files and all(in_build_context(f, rules) for f in files), f"COPY {src}: not (all) in the build context"
    weights = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx")
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv")]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            if in_build_context(rel, rules):
                assert not rel.startswith("tests/") and "__pycache__" not in rel and not rel.endswith(weights), f"{rel} would be sent to the Docker build"


# --- the checks catch real mistakes ----------------------------------------------------------


def _break(objs: list[dict], kind: str, name: str, change) -> list[dict]:
    broken = copy.deepcopy(objs)
    change(one(broken, kind, name))
    return broken


def _draft(o):
    return o["spec"]["template"]["spec"]["containers"][0]


def _config(o):
    return o["data"]


def test_the_checks_catch_broken_manifests():
    objs = render("dev-cpu")
    config_name = next(o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specdec-config"))
    cases = [
        (check_builtin_kinds, "Deployment", "specdec-draft", lambda o: o["spec"].update(replica=2)),  # misspelt field
        (check_builtin_kinds, "RayCluster", "specdec-target", lambda o: o["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].update(imagePullPolicy=3)),
        (check_custom_resources, "RayCluster", "specdec-target", lambda o: o["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0})),
        (check_custom_resources, "RayCluster", "specdec-target", lambda o: o["spec"].update(workerGroupSpec=[])),
        (check_ports, "Service", "specdec-draft", lambda o: o["spec"]["ports"][0].update(targetPort="grcp")),
        (check_ports, "Deployment", "specdec-draft", lambda o: _draft(o)["readinessProbe"]["grpc"].update(port=50053)),
        (check_ports, "Deployment", "specdec-coordinator", lambda o: o["spec"]["template"]["metadata"]["annotations"].update({"prometheus.io/port": "9999"})),
        (check_env, "ConfigMap", config_name, lambda o: _config(o).pop("OTEL_EXPORTER_OTLP_ENDPOINT")),
        (check_env, "ConfigMap", config_name, lambda o: _config(o).update(SPECDEC_DRAFT_MAX_BATCHES="8")),
        (check_env, "ConfigMap", config_name, lambda o: _config(o).update(SPECDEC_CACHE_DIR="/tmp/elsewhere")),
        (check_env, "Job", "specdec-target-pool", lambda o: _draft(o)["env"].pop(next(i for i, v in enumerate(_draft(o)["env"]) if v["name"] == "RAY_AUTH_TOKEN"))),
        (check_env, "RayCluster", "specdec-target", lambda o: o["spec"]["autoscalerOptions"].pop("env")),
        (check_secrets, "Deployment", "specdec-coordinator", lambda o: _draft(o)["env"].append({"name": "RAY_AUTH_TOKEN", "value": "abc"})),
        (check_references, "Deployment", "specdec-draft", lambda o: _draft(o)["envFrom"][0]["configMapRef"].update(name="specdec-config")),
        (check_command_lines, "Deployment", "specdec-coordinator", lambda o: _draft(o)["args"].append("--max-tokens=8")),
        (check_command_lines, "Deployment", "specdec-coordinator", lambda o: _draft(o).update(args=[a for a in _draft(o)["args"] if "specdec-draft" not in a and a != "--draft"])),
        (check_command_lines, "ConfigMap", config_name, lambda o: _config(o).update(SPECDEC_COORDINATOR_PIPELINE="yes")),
        (check_command_lines, "ConfigMap", config_name, lambda o: _config(o).update(SPECDEC_DRAFT_PORT="50052")),
        (check_command_lines, "Job", "specdec-target-pool", lambda o: _draft(o)["args"].__setitem__(0, "targets")),
        (check_command_lines, "Job", "specdec-target-pool", lambda o: _draft(o)["args"].__setitem__(_draft(o)["args"].index("$(TARGET_MODEL)"), "$(TARGET_MODLE)")),
        (check_wiring, "Deployment", "specdec-coordinator", lambda o: _draft(o)["args"].__setitem__(2, "dns:///specdec-drafts.specdec-dev.svc.cluster.local:50052")),
        (check_wiring, "Service", "specdec-draft", lambda o: o["spec"].pop("clusterIP")),
        (check_wiring, "ConfigMap", config_name, lambda o: _config(o).update(SPECDEC_COORDINATOR_MAX_DRAFT_TOKENS="64")),
        (check_wiring, "Deployment", "specdec-draft", lambda o: o["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=50)),
        (check_wiring, "Job", "specdec-target-pool", lambda o: _draft(o)["args"].__setitem__(_draft(o)["args"].index("--metrics-host") + 1, "127.0.0.1")),
        (check_autoscaling, "Deployment", "specdec-draft", lambda o: o["spec"].update(replicas=3)),
        (check_autoscaling, "PodDisruptionBudget", "specdec-coordinator", lambda o: o["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/name": "coordinator"})),
        (check_ray_versions, "RayCluster", "specdec-target", lambda o: o["spec"].update(rayVersion="2.59.0")),
        (check_tracing, "ConfigMap", config_name, lambda o: _config(o).update(OTEL_EXPORTER_OTLP_ENDPOINT="http://specdec-otel-collector:4318")),
    ]
    for check, kind, name, change in cases:
        assert check(objs) == [], f"{check.__name__} fails on the unbroken render"
        assert check(_break(objs, kind, name, change)) != [], f"{check.__name__} missed a broken {kind} {name}"
    # Target tier: too many actors for the group; a GPU in the CPU overlay; work on the head.
    too_many = _break(objs, "Job", "specdec-target-pool", lambda o: next(v for v in _draft(o)["env"] if v["name"] == "TARGET_REPLICAS").update(value="9"))
    assert check_target_tier(too_many, "dev-cpu") != []
    assert check_target_tier(_break(objs, "ConfigMap", config_name, lambda o: _config(o).update(TARGET_CPUS_PER_ACTOR="1")), "dev-cpu") != []
    assert check_target_tier(_break(objs, "RayCluster", "specdec-target", lambda o: o["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": "1"})), "dev-cpu") != []
    assert check_target_tier(objs, "gpu") != [], "the CPU overlay has no GPU workers, which the gpu check must notice"
    renamed = _break(objs, "RayCluster", "specdec-target", lambda o: o["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["ports"][1].update(name="metrics"))
    assert check_target_tier(renamed, "dev-cpu") != [], "the actor's port may not take the name KubeRay gives Ray's exporter"
