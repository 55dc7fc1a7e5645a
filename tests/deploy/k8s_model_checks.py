"""The deploy check for models served from a PersistentVolumeClaim (the gpu overlay's pair):
fetched there by the fill Job, mounted and waited for by every pod that loads them."""

import json

from k8s_objects import container_env, containers, one, parse_specdec


def check_models(objs: list[dict]) -> list[str]:
    """Every model path a pod loads (the target's, the draft's, the coordinator's tokenizer) that
    lies under a mounted PersistentVolumeClaim is one the fill Job fetches into that claim, and
    every such pod waits for the fill to complete before it starts."""
    from specdec.draft_service.hybrid import parse_spec

    problems = []
    fills = {}  # claim name -> (mount path, model directory names the Job writes)
    for owner, _, template, c in containers(objs):
        argv = c.get("args") or []
        if owner["kind"] == "Job" and argv[:1] == ["fetch-models"]:
            args = parse_specdec(argv, {})[1]
            claims = _claims_mounted(template, c)
            for claim, path in claims.items():
                if path == args.to:
                    fills[claim] = (path, {repo.rsplit("/", 1)[-1] for repo in args.repos})
    for claim in fills:
        pvc = one(objs, "PersistentVolumeClaim", claim)
        if not {"ReadWriteMany", "ReadOnlyMany"} & set(pvc["spec"].get("accessModes", [])):
            problems.append(f"PersistentVolumeClaim {claim}: pods on several nodes mount it: ReadWriteMany")
    for owner, role, template, c in containers(objs):
        if template is None or owner["kind"] == "Job":
            continue
        env = container_env(objs, owner, c)
        wanted = [env.get("TARGET_MODEL", "")] if role in ("target-worker", "coordinator") else []
        if role == "draft":
            wanted.append(parse_spec(env.get("SPECDEC_DRAFT_DRAFT_MODEL", "")) or "")
        claims = _claims_mounted(template, c)
        for path in filter(None, wanted):
            for claim, (mount, names) in fills.items():
                if not path.startswith(mount + "/"):
                    continue
                if claims.get(claim) != mount:
                    problems.append(f"{role}/{c['name']} loads {path} but does not mount {claim} at {mount}")
                if path[len(mount) + 1 :].split("/")[0] not in names:
                    problems.append(f"{role}/{c['name']} loads {path}, which the fill Job does not fetch")
                waits = [i for i in template["spec"].get("initContainers", []) if f"{mount}/.complete" in json.dumps(i)]
                if not waits:
                    problems.append(f"{role}: no init container waits for {mount}/.complete before loading {path}")
    return problems


def _claims_mounted(template: dict, container: dict) -> dict[str, str]:
    """PersistentVolumeClaim name -> where the container mounts it."""
    volumes = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in template["spec"].get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    return {volumes[m["name"]]: m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in volumes}
