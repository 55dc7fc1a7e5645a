"""Load-driven scaling in k8s/, checked offline on both rendered overlays.

`check_load_scaling` returns the problems it finds: the coordinator and draft Deployments scaled
by KEDA ScaledObjects (valid against KEDA's CRD schema in k8s/schemas/) whose Prometheus queries
name only series that tier's process exports, in the overlay's own namespace, from pods that
Prometheus scrapes on the port the process serves them on; no other autoscaler on those
Deployments (two would fight over the count); and a pool keeper that sizes the pool from its
load within bounds the Ray worker group can hold. The last test breaks rendered copies on
purpose and expects the check to notice.
"""

from __future__ import annotations

import copy
import re

import pytest
from k8s_checks import check_custom_resources
from k8s_objects import OVERLAYS, find, one, parsed, render, specdec_commands

from specdec.coordinator import metrics as coordinator_metrics
from specdec.draft_service import metrics as draft_metrics

# The Deployment each ScaledObject scales -> (the role its pods are, the module whose metrics it
# exports).
SCALED = {
    "specdec-coordinator": ("coordinator", coordinator_metrics),
    "specdec-draft": ("draft", draft_metrics),
}
SERIES = re.compile(r"\bspecdec:[a-z_]+")


def _exported(module) -> set[str]:
    """The series names a metrics module defines (counters also as their _total)."""
    names = set()
    for value in vars(module).values():
        describe = getattr(value, "describe", None)
        if describe is None or not hasattr(value, "_name"):
            continue
        for family in describe():
            names.add(family.name)
            if family.type == "counter":
                names.add(family.name + "_total")
    return names


def _metrics_port(objs: list[dict], role: str) -> int:
    return parsed(objs, role).metrics_port


def check_load_scaling(objs: list[dict]) -> list[str]:
    problems = []
    scaled = {o["spec"]["scaleTargetRef"]["name"]: o for o in find(objs, "ScaledObject")}
    for name, (role, module) in SCALED.items():
        so = scaled.get(name)
        if so is None:
            problems.append(f"Deployment {name}: no ScaledObject scales it on its load")
            continue
        deployment = one(objs, "Deployment", name)
        namespace = deployment["metadata"]["namespace"]
        spec = so["spec"]
        if not 1 <= spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100):
            problems.append(f"ScaledObject {name}: need 1 <= minReplicaCount <= maxReplicaCount")
        if "replicas" in deployment["spec"]:
            problems.append(f"Deployment {name}: spec.replicas is set, and every apply would undo the autoscaler")
        triggers = spec.get("triggers", [])
        if not triggers or any(t["type"] != "prometheus" for t in triggers):
            problems.append(f"ScaledObject {name}: its triggers are not all Prometheus queries of its load")
        exported = _exported(module)
        for t in triggers:
            meta, label = t.get("metadata", {}), f"ScaledObject {name} trigger {t.get('name')}"
            query = meta.get("query", "")
            series = set(SERIES.findall(query))
            if not series:
                problems.append(f"{label}: the query reads no specdec series: {query!r}")
            if series - exported:
                problems.append(f"{label}: {sorted(series - exported)} are not exported by the {role}")
            namespaces = set(re.findall(r'namespace="([^"]*)"', query))
            if namespaces != {namespace}:
                problems.append(f"{label}: the query selects namespaces {sorted(namespaces)}, not {namespace}")
            try:
                if float(meta.get("threshold", "0")) <= 0:
                    problems.append(f"{label}: threshold {meta.get('threshold')} is not positive")
            except ValueError:
                problems.append(f"{label}: threshold {meta.get('threshold')!r} is not a number")
            if not meta.get("serverAddress", "").startswith("http"):
                problems.append(f"{label}: no Prometheus serverAddress")
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
        port = _metrics_port(objs, role)
        if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/port") != str(port):
            problems.append(f"Deployment {name}: its pods are not scraped on the metrics port {port} it serves")
    for hpa in find(objs, "HorizontalPodAutoscaler"):
        if hpa["spec"]["scaleTargetRef"]["name"] in scaled:
            problems.append(f"HPA {hpa['metadata']['name']}: a second autoscaler on a ScaledObject's Deployment")

    keeper = parsed(objs, "target-pool")
    (rc,) = find(objs, "RayCluster")
    (group,) = rc["spec"]["workerGroupSpecs"]
    if not keeper.autoscale or not keeper.keep:
        problems.append("the pool keeper does not size the pool from its load (--autoscale on with --keep)")
    if not keeper.min_replicas <= keeper.replicas <= keeper.max_replicas:
        problems.append(
            f"the pool keeper starts at {keeper.replicas}, outside [{keeper.min_replicas}, {keeper.max_replicas}]"
        )
    if keeper.max_replicas > group["maxReplicas"]:
        problems.append(
            f"the pool keeper may ask for {keeper.max_replicas} actors, the worker group holds {group['maxReplicas']}"
        )
    return problems


@pytest.fixture(params=OVERLAYS)
def objs(request) -> list[dict]:
    return render(request.param)


def test_each_tier_scales_on_its_own_load(objs):
    assert check_load_scaling(objs) == []
    assert {o["metadata"]["name"] for o in find(objs, "ScaledObject")} == set(SCALED)


def test_the_scaled_objects_validate_against_kedas_crd_schema(objs):
    assert find(objs, "ScaledObject")
    assert check_custom_resources(objs) == []
    broken = copy.deepcopy(objs)
    one(broken, "ScaledObject", "specdec-draft")["spec"]["triggers"][0].pop("type")
    one(broken, "ScaledObject", "specdec-coordinator")["spec"]["minReplicaCount"] = "two"
    one(broken, "ScaledObject", "specdec-coordinator")["spec"]["maxReplicas"] = 6  # the HPA's spelling
    found = check_custom_resources(broken)
    for wrong in ("'type' is a required property", "'two' is not of type 'integer'", "'maxReplicas' was unexpected"):
        assert any(wrong in p for p in found), (wrong, found)


def test_the_keeper_command_line_parses_with_its_autoscaling_flags(objs):
    (argv,) = [argv for role, _, argv, _ in specdec_commands(objs) if role == "target-pool"]
    assert "--autoscale" in argv and "--max-replicas" in argv


def test_the_check_catches_broken_scaling():
    base = render("dev-cpu")
    assert check_load_scaling(base) == []

    def trigger(o, name, i=0):
        return one(o, "ScaledObject", name)["spec"]["triggers"][i]["metadata"]

    def keeper_args(o):
        return one(o, "Deployment", "specdec-target-pool")["spec"]["template"]["spec"]["containers"][0]["args"]

    def set_arg(o, flag, value):
        args = keeper_args(o)
        args[args.index(flag) + 1] = value

    def cpu_hpa(o):
        o.append(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "cpu", "namespace": "specdec-dev"},
                "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "specdec-draft"}, "maxReplicas": 2},
            }
        )

    breaks = {
        "no draft scaler": lambda o: o.remove(one(o, "ScaledObject", "specdec-draft")),
        "a misspelt series": lambda o: trigger(o, "specdec-draft").update(
            query='sum(specdec:draft_request_running{namespace="specdec-dev"})'
        ),
        "another tier's series": lambda o: trigger(o, "specdec-draft").update(
            query='sum(specdec:requests_waiting{namespace="specdec-dev"})'
        ),
        "the base's namespace": lambda o: trigger(o, "specdec-coordinator", 1).update(
            query='sum(specdec:requests_waiting{namespace="specdec"})'
        ),
        "no threshold": lambda o: trigger(o, "specdec-coordinator").pop("threshold"),
        "unscraped pods": lambda o: one(o, "Deployment", "specdec-draft")["spec"]["template"]["metadata"][
            "annotations"
        ].update({"prometheus.io/port": "9999"}),
        "a CPU HPA beside it": cpu_hpa,
        "fixed replicas": lambda o: one(o, "Deployment", "specdec-coordinator")["spec"].update(replicas=3),
        "keeper fixed": lambda o: set_arg(o, "--autoscale", "off"),
        "keeper beyond the group": lambda o: set_arg(o, "--max-replicas", "9"),
    }
    for what, breaking in breaks.items():
        broken = copy.deepcopy(base)
        breaking(broken)
        assert check_load_scaling(broken), f"{what}: not noticed"
