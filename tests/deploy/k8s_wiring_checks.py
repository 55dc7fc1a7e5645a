"""The deploy check that the parts are wired to each other: the addresses, ports and numbers the
coordinator, the draft service and the target pool must agree on, read from their parsed configs.
Each part of check_wiring returns a list of problems (empty: none)."""

import re
from functools import cache

from k8s_objects import find, one, parsed, pod_templates, role_containers

_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def check_wiring(objs: list[dict]) -> list[str]:
    """The addresses and numbers that the parts must agree on, read from the parsed configs."""
    coordinator, draft, pool = parsed(objs, "coordinator"), parsed(objs, "draft"), parsed(objs, "target-pool")
    (coordinator_c,) = role_containers(objs, "coordinator")
    (draft_c,) = role_containers(objs, "draft")
    return (
        _coordinator_to_draft(objs, coordinator, draft, draft_c)
        + _ray_joins(objs, coordinator, pool)
        + _pool_and_draft_length(coordinator, draft, pool)
        + _metrics_ports(objs, coordinator, draft, pool)
        + _grpc_probes((("coordinator", coordinator_c, coordinator.server.port), ("draft", draft_c, draft.port)))
        + _draining(
            objs,
            (
                ("coordinator", "specdec-coordinator", coordinator_c, coordinator.server.grace_s),
                ("draft", "specdec-draft", draft_c, draft.drain_delay_s + draft.grace_s),
            ),
        )
    )


def _service_port(objs: list[dict], name: str, namespace: str, port: int) -> dict | None:
    for svc in find(objs, "Service", name):
        if svc["metadata"].get("namespace") == namespace:
            return next((p for p in svc["spec"]["ports"] if p["port"] == port), None)
    return None


def _coordinator_to_draft(objs: list[dict], coordinator, draft, draft_c: dict) -> list[str]:
    """coordinator -> draft: a headless Service by DNS, to the port the draft serves on."""
    m = re.fullmatch(r"dns:///([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", coordinator.draft)
    if not m:
        return [f"coordinator --draft {coordinator.draft}: expected dns:///SERVICE.NAMESPACE.svc.cluster.local:PORT"]
    svc_name, ns, port = m.group(1), m.group(2), int(m.group(3))
    port_spec = _service_port(objs, svc_name, ns, port)
    if port_spec is None:
        return [f"coordinator --draft: no Service {svc_name} in {ns} with port {port}"]
    problems = []
    svc = one(objs, "Service", svc_name)
    if svc["spec"].get("clusterIP") != "None":
        problems.append(
            f"Service {svc_name} must be headless (clusterIP: None) for the draft client to see every replica"
        )
    target = port_spec.get("targetPort", port)
    numbers = {p["containerPort"] for p in draft_c["ports"] if target in (p.get("name"), p["containerPort"])}
    if numbers != {draft.port}:
        problems.append(
            f"Service {svc_name} sends port {port} to container port {numbers}, the draft listens on {draft.port}"
        )
    return problems


def _ray_joins(objs: list[dict], coordinator, pool) -> list[str]:
    """coordinator and pool keeper -> the Ray head's GCS port (they join as nodes: never the
    client port, through which every verify call would pass, and a Ray Client's session is
    lost with the head)."""
    problems = []
    ray_clusters = find(objs, "RayCluster")
    coordinator_ns = one(objs, "Deployment", "specdec-coordinator")["metadata"].get("namespace")
    for who, address in (("coordinator --ray-join", coordinator.ray_join), ("target-pool --ray-join", pool.ray_join)):
        m = re.fullmatch(r"([a-z0-9-]+)-head-svc\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", address or "")
        clusters = [
            rc
            for rc in ray_clusters
            if m and rc["metadata"]["name"] == m.group(1) and rc["metadata"].get("namespace") == m.group(2)
        ]
        if not clusters:
            problems.append(
                f"{who} {address}: expected RAYCLUSTER-head-svc.NAMESPACE.svc.cluster.local:PORT "
                "of a rendered RayCluster"
            )
            continue
        head = clusters[0]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        names = {p["containerPort"]: p.get("name") for p in head.get("ports", [])}
        if names.get(int(m.group(3))) != "gcs-server":
            problems.append(f"{who}: port {m.group(3)} is not the Ray head's gcs-server port")
        if m.group(2) != coordinator_ns:
            problems.append(f"{who}: namespace {m.group(2)} is not the deployment's ({coordinator_ns})")
    return problems


def _pool_and_draft_length(coordinator, draft, pool) -> list[str]:
    """The coordinator looks for the pool the keeper creates, and may not ask the draft for more
    tokens than it serves."""
    problems = []
    if (pool.name, pool.namespace) != (coordinator.target_pool, coordinator.namespace):
        problems.append(
            f"the keeper creates pool {pool.name} in Ray namespace {pool.namespace}; "
            f"the coordinator looks for {coordinator.target_pool} in {coordinator.namespace}"
        )
    if coordinator.engine.max_draft_tokens > draft.draft.max_draft_tokens:
        problems.append(
            f"coordinator max-draft-tokens {coordinator.engine.max_draft_tokens} "
            f"> draft max-draft-tokens {draft.draft.max_draft_tokens}"
        )
    return problems


def _metrics_ports(objs: list[dict], coordinator, draft, pool) -> list[str]:
    """Metrics: bound on all interfaces, on the port the scrape annotation names."""
    problems = []
    for role, host, port in (
        ("coordinator", coordinator.server.host, coordinator.metrics_port),
        ("draft", draft.host, draft.metrics_port),
        ("target-worker", pool.metrics_host, pool.metrics_port),
    ):
        if host != "0.0.0.0":
            problems.append(f"{role}: metrics bind to {host}, not reachable by Prometheus (0.0.0.0)")
        for _, r, template in pod_templates(objs):
            annotated = template["metadata"].get("annotations", {}).get("prometheus.io/port")
            if r == role and annotated != str(port):
                problems.append(f"{role}: prometheus.io/port is {annotated}, metrics are on {port}")
    return problems


def _grpc_probes(servers) -> list[str]:
    """gRPC probes, for each (role, container, serving port): on the serving port; a named
    service must be a real one."""
    problems = []
    services = _grpc_service_names()
    for role, container, config_port in servers:
        for kind in _PROBES:
            probe = container.get(kind, {})
            if "grpc" not in probe:
                problems.append(f"{role}: {kind} must be a native grpc probe on the health service")
                continue
            if probe["grpc"]["port"] != config_port:
                problems.append(f"{role}: {kind} probes port {probe['grpc']['port']}, the server is on {config_port}")
            if probe["grpc"].get("service", "") not in services | {""}:
                problems.append(
                    f"{role}: {kind} asks about service {probe['grpc']['service']!r}, not one the server registers"
                )
    return problems


def _draining(objs: list[dict], servers) -> list[str]:
    """Draining, for each (role, Deployment, container, drain seconds): the pod is given drain +
    grace, and liveness never fires during it."""
    problems = []
    for role, owner_name, container, drain_s in servers:
        spec = one(objs, "Deployment", owner_name)["spec"]["template"]["spec"]
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        pre_stop_s = float(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0.0
        budget = spec.get("terminationGracePeriodSeconds", 30)
        if budget <= pre_stop_s + drain_s:
            problems.append(
                f"{role}: terminationGracePeriodSeconds {budget} <= preStop {pre_stop_s} + drain/grace {drain_s}"
            )
        live = container.get("livenessProbe", {})
        if live.get("periodSeconds", 10) * live.get("failureThreshold", 3) <= pre_stop_s + drain_s:
            problems.append(
                f"{role}: liveness would kill a draining pod (period x threshold <= {pre_stop_s + drain_s} s)"
            )
    return problems


@cache
def _grpc_service_names() -> frozenset[str]:
    from specdec.v1 import draft_pb2, generation_pb2

    return frozenset(s.full_name for m in (draft_pb2, generation_pb2) for s in m.DESCRIPTOR.services_by_name.values())
