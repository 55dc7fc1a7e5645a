"""tests/deploy/test_k8s.py's view of the rendered manifests: rendering both overlays, walking their
objects, containers and environment, and the command lines they run as the real CLI parses them."""

import argparse
import contextlib
import io
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = ("dev-cpu", "gpu")
# The oldest Kubernetes the manifests support (native gRPC probes are GA in 1.27) and the newest
# that kubernetes-validate knows: a field added later or removed since fails one of them.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
IMAGE = "specdec"  # the image name in the base; overlays only retag it
CUSTOM_SCHEMAS = {
    ("ray.io/v1", "RayCluster"): K8S / "schemas" / "ray.io_v1_RayCluster.json",
    ("keda.sh/v1alpha1", "ScaledObject"): K8S / "schemas" / "keda.sh_v1alpha1_ScaledObject.json",
}
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
    "RAY_REDIS_ADDRESS": ("target-head",),  # GCS fault tolerance: the head's store (redis.yaml)
    "SPECDEC_COORDINATOR_TLS_CERT": "default: unset serves plaintext; in-cluster traffic stays in the cluster "
    "(TLS is for a port exposed outside it)",
    "SPECDEC_COORDINATOR_TLS_KEY": "default: goes with SPECDEC_COORDINATOR_TLS_CERT",
    "SPECDEC_DRAFT_AUTH_TOKEN": "default: unset leaves the draft port open to the cluster network; "
    "set it from a Secret to require a token",
    "SPECDEC_COORDINATOR_DRAFT_AUTH_TOKEN": "default: goes with SPECDEC_DRAFT_AUTH_TOKEN (the same Secret)",
    "SPECDEC_API_KEY": "default: read by `specdec up` and `specdec generate` only; a cluster's coordinators "
    "read SPECDEC_COORDINATOR_API_KEY (from the optional Secret specdec-api-key)",
    "SPECDEC_PACKED_LINEAR": "default: on, oneDNN's packed kernels for verify passes on a CPU "
    "(a second copy of the weights: 1.07 GB for the embedded target, inside the CPU overlay's 4 GiB worker); "
    "off on a GPU by itself",
    "SPECDEC_PAGED_DECODER": "default: on, the decoder written for the paged pass (the same arithmetic as "
    "transformers' modules, no memory added); 0 is for side-by-side benchmarks only",
    "SPECDEC_VLLM_PYTHON": "default: read by `specdec bench --peer vllm` on the machine that runs it, never "
    "by a served tier",
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
        pytest.fail(
            "kubectl is not on PATH: these tests render k8s/overlays/* with `kubectl kustomize` "
            "(kubectl >= 1.14 has kustomize built in)"
        )
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kubectl kustomize k8s/overlays/{overlay} failed:\n{done.stderr}"
    return done.stdout


def render(overlay: str) -> list[dict]:
    """The overlay's objects, a fresh copy each call (the tests below may break it)."""
    return [doc for doc in yaml.safe_load_all(_render_text(overlay)) if doc is not None]


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
            yield (
                rc,
                "target-autoscaler",
                None,
                {"name": "autoscaler", "env": options.get("env", []), "envFrom": options.get("envFrom", [])},
            )


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
                env[var["name"]] = {
                    "metadata.namespace": namespace,
                    "metadata.name": f"{owner['metadata']['name']}-pod",
                }.get(path, f"<{path}>")
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
    from specdec.cli.fetch_models import _parser as fetch_parser
    from specdec.coordinator.__main__ import _parser as coordinator_parser
    from specdec.draft_service.__main__ import _parser as draft_parser
    from specdec.target_service.__main__ import _parser as target_parser

    return {
        "coordinator": coordinator_parser,
        "draft": draft_parser,
        "target": lambda environ: target_parser(),
        "fetch-models": lambda environ: fetch_parser(),
    }


def parse_specdec(argv: list[str], env: dict[str, str]):
    """Parse `specdec ARGV` (the container's args) as the entrypoint would, with the container's
    environment as the environment; returns (subcommand, config-or-namespace) or raises ValueError."""
    from specdec.coordinator.__main__ import parse_config as coordinator_config
    from specdec.draft_service.__main__ import parse_config as draft_config

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
            return sub, _parsers()[sub](env).parse_args(rest)
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
