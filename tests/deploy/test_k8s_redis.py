"""GCS fault tolerance in k8s/: the Redis the Ray head keeps its state in (base/redis.yaml) and the
RayCluster's wiring to it, checked offline on both rendered overlays.

`check_gcs_ft` returns the problems it finds: a StatefulSet of one Redis on a claim of its own
(volumeClaimTemplates) with an append-only file, behind a Service whose port is the container's;
a password only from the Secret specdec-redis, the same one for Redis and the head; a head with
KubeRay's fault tolerance on (`ray.io/ft-enabled`: the RayCluster schema in k8s/schemas/ has no
gcsFaultToleranceOptions), RAY_REDIS_ADDRESS naming that Service and `redis-password` from the
environment; and worker raylets that wait for a restarted head longer than it takes to come back.
The last test breaks rendered copies on purpose and expects the check to notice.
"""

from __future__ import annotations

import copy

import pytest
from k8s_checks import check_builtin_kinds, check_custom_resources, check_secrets
from k8s_objects import OVERLAYS, container_env, containers, find, one, quantity, render

REDIS = "specdec-redis"
SECRET = (REDIS, "password")  # (Secret, key): created by the operator, only referenced here
# A head pod rescheduled on another node pulls its image and starts Ray: minutes at worst. The
# workers' raylets must wait longer than that (Ray's default is 60 s; KubeRay sets 600 s).
HEAD_BACK_S = 300
RECONNECT = "RAY_gcs_rpc_server_reconnect_timeout_s"


@pytest.fixture(params=OVERLAYS)
def objs(request) -> list[dict]:
    return render(request.param)


def _secret_ref(container: dict, name: str) -> tuple[str, str] | None:
    for var in container.get("env", []):
        if var["name"] == name:
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            return None if ref is None or ref.get("optional") else (ref["name"], ref["key"])
    return None


def check_gcs_ft(objs: list[dict]) -> list[str]:
    problems = []
    sets = find(objs, "StatefulSet", REDIS)
    services = find(objs, "Service", REDIS)
    if len(sets) != 1 or len(services) != 1:
        return [f"expected one StatefulSet and one Service {REDIS}, found {len(sets)} and {len(services)}"]
    (redis,), (service,) = sets, services
    spec = redis["spec"]
    if spec.get("replicas", 1) != 1:
        problems.append(f"StatefulSet {REDIS}: one replica (KubeRay supports a standalone Redis only)")
    (c,) = spec["template"]["spec"]["containers"]
    claims = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates", [])}
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    data = [name for name in claims if mounts.get(name) == "/data"]
    if not data:
        problems.append(f"StatefulSet {REDIS}: /data is not on a volumeClaimTemplate (a restart would lose the GCS)")
    elif quantity(claims[data[0]]["spec"]["resources"]["requests"]["storage"]) <= 0:
        problems.append(f"StatefulSet {REDIS}: the claim requests no storage")
    command = " ".join(c.get("command", []) + c.get("args", []))
    if "--appendonly yes" not in command or "--dir /data" not in command:
        problems.append(f"StatefulSet {REDIS}: no append-only file in /data ({command!r})")
    if '--requirepass "$REDIS_PASSWORD"' not in command:
        problems.append(f"StatefulSet {REDIS}: redis-server does not require the password from its environment")
    if _secret_ref(c, "REDIS_PASSWORD") != SECRET:
        problems.append(f"StatefulSet {REDIS}: REDIS_PASSWORD is not from the required Secret {SECRET}")
    labels = spec["template"]["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in service["spec"]["selector"].items()):
        problems.append(f"Service {REDIS}: its selector does not match the Redis pod")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    (port,) = service["spec"]["ports"]
    if ports.get(port["targetPort"], port["targetPort"]) not in ports.values():
        problems.append(f"Service {REDIS}: targetPort {port['targetPort']} is not a port of the Redis container")

    (rc,) = find(objs, "RayCluster")
    if rc["metadata"].get("annotations", {}).get("ray.io/ft-enabled") != "true":
        problems.append("RayCluster: GCS fault tolerance is off (annotation ray.io/ft-enabled)")
    head = rc["spec"]["headGroupSpec"]
    head_c = head["template"]["spec"]["containers"][0]
    head_env = container_env(objs, rc, head_c)
    want = f"{REDIS}:{port['port']}"
    if head_env.get("RAY_REDIS_ADDRESS") not in (want, f"{REDIS}.{rc['metadata'].get('namespace')}.svc:{port['port']}"):
        problems.append(
            f"RayCluster head: RAY_REDIS_ADDRESS={head_env.get('RAY_REDIS_ADDRESS')}, not the Service {want}"
        )
    if _secret_ref(head_c, "REDIS_PASSWORD") != SECRET:
        problems.append(f"RayCluster head: REDIS_PASSWORD is not from the required Secret {SECRET}")
    if head["rayStartParams"].get("redis-password") != "$REDIS_PASSWORD":
        problems.append("RayCluster head: rayStartParams redis-password is not $REDIS_PASSWORD")
    # Every raylet other than the head's outwaits it: the workers', and the Ray nodes that the
    # coordinators and the keeper run (`--ray-join`), which would otherwise exit and restart.
    for owner, role, _, c in containers(objs):
        if role not in ("target-worker", "coordinator", "target-pool"):
            continue
        value = container_env(objs, owner, c).get(RECONNECT, "")
        if not value.isdigit() or int(value) <= HEAD_BACK_S:
            problems.append(
                f"{role}/{c['name']}: {RECONNECT}={value or 'unset'} (Ray's 60 s): a Ray node must "
                f"outwait a head restart (> {HEAD_BACK_S} s)"
            )
    return problems


# --- tests -----------------------------------------------------------------------------------


def test_redis_and_the_heads_fault_tolerance_are_wired(objs):
    assert check_gcs_ft(objs) == []


def test_redis_objects_validate_and_its_password_is_only_referenced(objs):
    redis = [o for o in objs if o["metadata"]["name"] == REDIS]
    assert {o["kind"] for o in redis} == {"StatefulSet", "Service"}
    assert check_builtin_kinds(redis) == []
    assert check_custom_resources(objs) == []  # the RayCluster with its annotation and params
    assert check_secrets(objs) == []  # no Secret rendered, no literal password
    (claim,) = one(objs, "StatefulSet", REDIS)["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_the_check_catches_broken_wiring():
    base = render("dev-cpu")
    assert check_gcs_ft(base) == []

    def rc(o):
        return one(o, "RayCluster", "specdec-target")

    def head(o):
        return rc(o)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]

    def worker(o):
        return rc(o)["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]

    def coordinator(o):
        return one(o, "Deployment", "specdec-coordinator")["spec"]["template"]["spec"]["containers"][0]

    def keeper(o):
        return one(o, "Deployment", "specdec-target-pool")["spec"]["template"]["spec"]["containers"][0]

    def env_var(container, name):
        return next(v for v in container["env"] if v["name"] == name)

    breaks = {
        "no claim": lambda o: one(o, "StatefulSet", REDIS)["spec"].pop("volumeClaimTemplates"),
        "ft off": lambda o: rc(o)["metadata"]["annotations"].pop("ray.io/ft-enabled"),
        "another Redis": lambda o: env_var(head(o), "RAY_REDIS_ADDRESS").update(value="redis:6379"),
        "another Secret": lambda o: env_var(head(o), "REDIS_PASSWORD")["valueFrom"]["secretKeyRef"].update(
            name="other"
        ),
        "literal password": lambda o: rc(o)["spec"]["headGroupSpec"]["rayStartParams"].update(
            {"redis-password": "hunter2"}
        ),
        "Ray's 60 s": lambda o: env_var(worker(o), RECONNECT).update(value="60"),
        "no wait": lambda o: worker(o)["env"].remove(env_var(worker(o), RECONNECT)),
        "coordinator's 60 s": lambda o: env_var(coordinator(o), RECONNECT).update(value="60"),
        "keeper's none": lambda o: keeper(o)["env"].remove(env_var(keeper(o), RECONNECT)),
    }
    for what, breaking in breaks.items():
        broken = copy.deepcopy(base)
        breaking(broken)
        assert check_gcs_ft(broken), f"{what}: not noticed"
