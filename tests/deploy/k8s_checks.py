"""The consistency checks of tests/deploy/test_k8s.py, each returning a list of problems (empty: none),
and the image's Dockerfile and build context read back."""

import json
import os
import re

import jsonschema
import kubernetes_validate
import yaml
from k8s_objects import (
    _SECRET_LIKE,
    _VAR_REF,
    CUSTOM_SCHEMAS,
    ENV_POLICY,
    ENV_PREFIXES,
    K8S_VERSIONS,
    RAY_ROLES,
    ROOT,
    _parsers,
    container_env,
    containers,
    env_name,
    find,
    flags_given,
    labels_match,
    one,
    parse_specdec,
    parsed,
    pod_templates,
    quantity,
    role_containers,
    specdec_commands,
)

# --- checks: each returns a list of problems -----------------------------------------------


def check_builtin_kinds(objs: list[dict], version: str = K8S_VERSIONS[0]) -> list[str]:
    problems = []
    for o in objs:
        if (o["apiVersion"], o["kind"]) in CUSTOM_SCHEMAS:
            continue
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(
                f"{o['apiVersion']} {o['kind']}: neither a Kubernetes {version} kind nor a schema in k8s/schemas/"
            )
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{o['kind']} {o['metadata'].get('name')}: {e.message} at {'.'.join(map(str, e.path))}")
    # The pod templates inside custom resources are core/v1 PodTemplateSpecs: validate them too.
    for owner, role, template in pod_templates([o for o in objs if (o["apiVersion"], o["kind"]) in CUSTOM_SCHEMAS]):
        wrapper = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{owner['metadata']['name']}-{role}"},
            "template": template,
        }
        try:
            kubernetes_validate.validate(wrapper, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(
                f"{owner['kind']} {owner['metadata']['name']} ({role}) pod template: "
                f"{e.message} at {'.'.join(map(str, e.path))}"
            )
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
            problems.append(
                f"{o['kind']} {o['metadata'].get('name')}: {error.message} at {'/'.join(map(str, error.absolute_path))}"
            )
    return problems


def check_references(objs: list[dict]) -> list[str]:
    """Every ConfigMap a pod names is rendered (kustomize renames generated ones: a name it does
    not rewrite, as in a custom resource it was not taught about, is a dangling reference)."""
    problems = []
    maps = {o["metadata"]["name"] for o in find(objs, "ConfigMap")}
    for _owner, role, template, c in containers(objs):
        for source in c.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref and ref["name"] not in maps and not ref.get("optional"):
                problems.append(f"{role}/{c['name']}: envFrom names ConfigMap {ref['name']}, which is not rendered")
        for var in c.get("env", []):
            ref = var.get("valueFrom", {}).get("configMapKeyRef")
            if ref and ref["name"] not in maps:
                problems.append(
                    f"{role}/{c['name']}: {var['name']} names ConfigMap {ref['name']}, which is not rendered"
                )
        for volume in (template or {}).get("spec", {}).get("volumes", []):
            if "configMap" in volume and volume["configMap"]["name"] not in maps:
                problems.append(
                    f"{role}: volume {volume['name']} names ConfigMap {volume['configMap']['name']}, "
                    "which is not rendered"
                )
    return problems


def check_ports(objs: list[dict]) -> list[str]:
    """Every port a Service, a probe or a scrape annotation names exists on the container."""
    problems = []
    templates = list(pod_templates(objs))

    def has_port(template: dict, port) -> bool:
        return any(
            p.get("name") == port or p["containerPort"] == port
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
        )

    for svc in find(objs, "Service"):
        selected = [
            t
            for o, _, t in templates
            if o["metadata"].get("namespace") == svc["metadata"].get("namespace")
            and labels_match(svc["spec"].get("selector", {}), t["metadata"].get("labels", {}))
        ]
        if not selected:
            problems.append(f"Service {svc['metadata']['name']}: its selector matches no pod template")
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for t in selected:
                if not has_port(t, target):
                    problems.append(
                        f"Service {svc['metadata']['name']} port {port.get('name')}: targetPort {target} "
                        "is not a container port of the pods it selects"
                    )
    for _owner, role, template in templates:
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
    flag_envs = {
        prefix: {env_name(prefix, a) for a in parsers[role]({})._actions if a.option_strings and a.dest != "help"}
        for role, prefix in ENV_PREFIXES.items()
    }
    token_refs = set()
    for owner, role, _, c in containers(objs):
        env = container_env(objs, owner, c)
        for name, roles in ENV_POLICY.items():
            if isinstance(roles, tuple) and role in roles and not env.get(name):
                problems.append(f"{role}/{c['name']}: {name} is not set")
        for name, value in env.items():
            if _VAR_REF.search(value):
                problems.append(
                    f"{role}/{c['name']}: {name}={value} refers to a variable that is not defined before it"
                )
            for prefix, known in flag_envs.items():
                if name.startswith(prefix) and name not in known:
                    problems.append(
                        f"{role}/{c['name']}: {name} is set but `specdec {prefix.split('_')[1].lower()}` "
                        "has no such flag (it would be ignored)"
                    )
        if role in ENV_POLICY["SPECDEC_CACHE_DIR"] and env.get("SPECDEC_CACHE_DIR"):
            mounts = [m["mountPath"].rstrip("/") for m in c.get("volumeMounts", [])]
            cache_dir = env["SPECDEC_CACHE_DIR"].rstrip("/")
            if not any(cache_dir == m or cache_dir.startswith(m + "/") for m in mounts):
                problems.append(f"{role}/{c['name']}: SPECDEC_CACHE_DIR={cache_dir} is not on a mounted volume")
        if role in RAY_ROLES:
            if env.get("RAY_AUTH_MODE") != "token":
                problems.append(
                    f"{role}/{c['name']}: RAY_AUTH_MODE must be 'token' (explicit, the same in every Ray process)"
                )
            refs = [
                v["valueFrom"]["secretKeyRef"]
                for v in c.get("env", [])
                if v["name"] == "RAY_AUTH_TOKEN" and "secretKeyRef" in v.get("valueFrom", {})
            ]
            if not refs or refs[0].get("optional"):
                problems.append(f"{role}/{c['name']}: RAY_AUTH_TOKEN must come from a (required) Secret")
            token_refs.update((r["name"], r["key"]) for r in refs)
    if len(token_refs) > 1:
        problems.append(f"RAY_AUTH_TOKEN comes from different Secrets: {sorted(token_refs)}")
    return problems


def check_secrets(objs: list[dict]) -> list[str]:
    """Secrets only by reference: none is rendered, and no secret-like variable has a literal value."""
    problems = [
        f"Secret {o['metadata']['name']} is in the manifests (create it in the cluster, reference it)"
        for o in find(objs, "Secret")
    ]
    for _owner, role, _, c in containers(objs):
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
                problems.append(
                    f"{role}/{c['name']}: argument {arg} refers to a variable the container does not define"
                )
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
                    problems.append(
                        f"{role}/{c['name']}: {action.option_strings[0]} is on the command line "
                        f"and {name} in the environment"
                    )
    for sub in ("coordinator", "draft", "target"):
        if sub not in roles_seen:
            problems.append(f"no container runs `specdec {sub}`")
    return problems


def check_target_tier(objs: list[dict], overlay: str) -> list[str]:
    """One target actor per Ray worker pod (so the worker group's replicas are the pool's size),
    no work on the head, a pool that fits the group, GPUs exactly where the overlay says."""
    problems = []
    pool = parsed(objs, "target-pool")
    (rc,) = find(objs, "RayCluster")
    spec = rc["spec"]
    if spec["headGroupSpec"]["rayStartParams"].get("num-cpus") != "0":
        problems.append('Ray head: rayStartParams num-cpus must be "0" (no work scheduled on it)')
    if not spec.get("enableInTreeAutoscaling"):
        problems.append("RayCluster: enableInTreeAutoscaling must be on (the pool keeper scales the worker group)")
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
            problems.append(
                f"worker group {group['groupName']}: num-cpus {cpus} with --cpus-per-actor {pool.cpus_per_actor} "
                "is not one actor per pod"
            )
        if quantity(worker["resources"]["requests"]["cpu"]) < cpus:
            problems.append(f"worker group {group['groupName']}: num-cpus {cpus} exceeds the pod's CPU request")
        if not group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"]:
            problems.append(f"worker group {group['groupName']}: replicas outside [minReplicas, maxReplicas]")
        if pool.replicas > group["maxReplicas"]:
            problems.append(
                f"the pool asks for {pool.replicas} actors; "
                f"worker group {group['groupName']} stops at {group['maxReplicas']} pods"
            )
        gpus = worker.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if overlay == "gpu" and not (gpus and int(gpus) >= 1):
            problems.append(f"gpu overlay: worker group {group['groupName']} has no nvidia.com/gpu limit")
    # GPUs per actor said outright: guessed from the cluster's resources, a pool created while the
    # GPU workers were still starting would be CPU actors, and kept.
    if pool.gpus_per_actor != (1 if overlay == "gpu" else 0):
        problems.append(f"{overlay} overlay: --gpus-per-actor is {pool.gpus_per_actor}, not set to what the overlay is")
    if overlay == "dev-cpu":
        for _, role, _, c in containers(objs):
            if "nvidia.com/gpu" in json.dumps(c.get("resources", {})):
                problems.append(f"dev-cpu overlay: {role}/{c['name']} asks for a GPU")
    return problems


def check_autoscaling(objs: list[dict]) -> list[str]:
    problems = []
    # KEDA's ScaledObjects make HPAs of their own (scaleTargetRef's kind defaults to Deployment).
    for so in find(objs, "ScaledObject"):
        ref = so["spec"]["scaleTargetRef"]
        targets = find(objs, ref.get("kind", "Deployment"), ref["name"])
        if not targets:
            problems.append(f"ScaledObject {so['metadata']['name']}: no {ref.get('kind', 'Deployment')} {ref['name']}")
        elif "replicas" in targets[0]["spec"]:
            problems.append(f"Deployment {ref['name']}: spec.replicas is set, and every apply would undo KEDA's HPA")
        if so["spec"].get("minReplicaCount", 0) > so["spec"].get("maxReplicaCount", 100):
            problems.append(f"ScaledObject {so['metadata']['name']}: minReplicaCount > maxReplicaCount")
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
            if name and any(
                name not in c.get("resources", {}).get("requests", {})
                for c in targets[0]["spec"]["template"]["spec"]["containers"]
            ):
                problems.append(
                    f"HPA {hpa['metadata']['name']} scales on {name} utilization, but a container has no {name} request"
                )
    for pdb in find(objs, "PodDisruptionBudget"):
        if not any(
            labels_match(pdb["spec"]["selector"]["matchLabels"], t["metadata"].get("labels", {}))
            for _, _, t in pod_templates(objs)
        ):
            problems.append(f"PodDisruptionBudget {pdb['metadata']['name']}: its selector matches no pods")
    if not any(
        labels_match(
            p["spec"]["selector"]["matchLabels"],
            one(objs, "Deployment", "specdec-coordinator")["spec"]["template"]["metadata"]["labels"],
        )
        for p in find(objs, "PodDisruptionBudget")
    ):
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
    receiver = (
        config.get("receivers", {})
        .get("otlp", {})
        .get("protocols", {})
        .get("grpc" if protocol == "grpc" else "http", {})
    )
    receiver_port = int(receiver.get("endpoint", ":-1").rsplit(":", 1)[1])
    if not svcs:
        problems.append(f"OTEL_EXPORTER_OTLP_ENDPOINT names Service {svc_name}, which is not rendered")
    else:
        port_spec = next((p for p in svcs[0]["spec"]["ports"] if p["port"] == port), None)
        collectors = [
            t
            for _, _, t in pod_templates(objs)
            if labels_match(svcs[0]["spec"]["selector"], t["metadata"].get("labels", {}))
        ]
        container_ports = [
            p
            for t in collectors
            for c in t["spec"]["containers"]
            for p in c.get("ports", [])
            if port_spec and port_spec.get("targetPort") in (p.get("name"), p["containerPort"])
        ]
        if not port_spec or [p["containerPort"] for p in container_ports] != [receiver_port]:
            problems.append(
                f"OTLP {protocol} to {svc_name}:{port} does not reach "
                f"the collector's {protocol} receiver on :{receiver_port}"
            )
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
    return [
        f"RayCluster {rc['metadata']['name']}: rayVersion {rc['spec'].get('rayVersion')} != the image's ray {image_ray}"
        for rc in find(objs, "RayCluster")
        if rc["spec"].get("rayVersion") != image_ray
    ]


# --- the image -------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in (raw.strip() for raw in text.splitlines())
        if line and not line.startswith("#")
    ]


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
