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

import jsonschema
import pytest
import yaml
from k8s_checks import (
    check_autoscaling,
    check_builtin_kinds,
    check_command_lines,
    check_custom_resources,
    check_env,
    check_ports,
    check_ray_versions,
    check_references,
    check_secrets,
    check_target_tier,
    check_tracing,
    dockerfile_args,
    dockerfile_instructions,
    dockerignore,
    in_build_context,
)
from k8s_model_checks import check_models
from k8s_objects import (
    _ENV_LITERAL,
    _ENV_READ,
    CODE_DIRS,
    ENV_POLICY,
    K8S,
    K8S_VERSIONS,
    OVERLAYS,
    ROOT,
    containers,
    env_name,
    find,
    is_specdec_image,
    one,
    render,
    specdec_commands,
)
from k8s_wiring_checks import check_wiring
from packaging.requirements import Requirement

from specdec import cli


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> str:
    return request.param


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
        ("Deployment", "specdec-draft"),
        ("Service", "specdec-draft"),
        ("ScaledObject", "specdec-draft"),
        ("RayCluster", "specdec-target"),
        ("Deployment", "specdec-target-pool"),
        ("Deployment", "specdec-coordinator"),
        ("Service", "specdec-coordinator"),
        ("ScaledObject", "specdec-coordinator"),
        ("PodDisruptionBudget", "specdec-coordinator"),
        ("Deployment", "specdec-otel-collector"),
        ("Service", "specdec-otel-collector"),
        ("Deployment", "specdec-jaeger"),
        ("Service", "specdec-jaeger"),
    ]:
        assert expected in kinds, f"{overlay}: {expected} is missing"
    config_maps = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specdec-config")]
    assert len(config_maps) == 1, "one ConfigMap holds specdec's configuration"
    namespaces = {o["metadata"].get("namespace") for o in objs}
    assert len(namespaces) == 1 and None not in namespaces, (
        f"{overlay}: every object in the overlay's namespace, got {namespaces}"
    )


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
    assert not undecided, (
        f"the code reads {undecided}: add each to ENV_POLICY in tests/deploy/k8s_objects.py "
        "(which roles must set it, or why its default is right) and set it in k8s/"
    )
    assert {"SPECDEC_CACHE_DIR", "RAY_AUTH_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT"} <= read, (
        "the grep still finds the variables it should"
    )


def test_env_vars_are_set_where_the_code_reads_them(overlay):
    assert check_env(render(overlay)) == []


def test_command_lines_are_accepted_by_the_cli(overlay):
    objs = render(overlay)
    assert check_command_lines(objs) == []
    # And through the entrypoint itself: `specdec <args> --help` with the container's environment.

    for role, _c, argv, env in specdec_commands(objs):
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()) as err,
                pytest.raises(SystemExit) as exit_,
            ):
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
    assert image_ray == installed, (
        f"the image pins ray {image_ray}, this environment runs {installed}: Ray client and cluster must match"
    )
    declared = next(
        Requirement(r)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if r.startswith("ray")
    )
    assert declared.specifier.contains(image_ray), f"pyproject asks for {declared}, the image pins {image_ray}"
    for overlay in OVERLAYS:
        objs = render(overlay)
        assert find(objs, "RayCluster") and check_ray_versions(objs) == []


def test_dockerfile_one_image_for_every_role():
    ops = dockerfile_instructions()
    assert [json.loads(arg) for op, arg in ops if op == "ENTRYPOINT"] == [["specdec"]]
    users = [arg for op, arg in ops if op == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) != 0, (
        "the image runs as a numeric non-root user"
    )
    uid = int(users[-1].split(":")[0])
    for overlay in OVERLAYS:
        for _, role, template, c in containers(render(overlay)):
            if template is not None and is_specdec_image(c):
                assert template["spec"]["securityContext"].get("runAsUser") == uid and template["spec"][
                    "securityContext"
                ].get("runAsNonRoot"), f"{overlay} {role}: runs as the image's user {uid}, non-root"
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
    for path in [
        "tests/test_k8s.py",
        "tests/conftest.py",
        ".git/HEAD",
        ".venv/bin/python",
        ".pytest_cache/v/x",
        "specdec/__pycache__/cli.cpython-311.pyc",
        "specdec.egg-info/PKG-INFO",
        "bench/results/run.json",
        "models/gemma/model.safetensors",
        "weights/target.gguf",
        "specdec/tiny.gguf",
        "coordinator/x.bin",
        "checkpoint.pt",
        ".cache/specdec/converted/model.safetensors",
        "k8s/base/draft.yaml",
    ]:
        assert not in_build_context(path, rules), f"{path} is in the Docker build context"
    sources = [
        src
        for op, arg in dockerfile_instructions()
        if op == "COPY"
        for src in arg.split()[:-1]
        if not src.startswith("--")
    ]
    assert sources, "the Dockerfile copies the project"
    for src in sources:
        assert not src.startswith("tests"), "no tests in the image"
        files = (
            [src]
            if (ROOT / src).is_file()
            else [str(p.relative_to(ROOT)) for p in (ROOT / src).rglob("*.py") if "__pycache__" not in p.parts]
        )
        assert files and all(in_build_context(f, rules) for f in files), f"COPY {src}: not (all) in the build context"
    weights = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx")
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv")]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            if in_build_context(rel, rules):
                assert not rel.startswith("tests/") and "__pycache__" not in rel and not rel.endswith(weights), (
                    f"{rel} would be sent to the Docker build"
                )


# --- the checks catch real mistakes ----------------------------------------------------------

CONFIG = "the specdec-config ConfigMap"  # its name carries kustomize's hash: read from the render


def _break(objs: list[dict], kind: str, name: str, change) -> list[dict]:
    broken = copy.deepcopy(objs)
    if name == CONFIG:
        name = _config_name(objs)
    change(one(broken, kind, name))
    return broken


def _config_name(objs: list[dict]) -> str:
    return next(
        o["metadata"]["name"]
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specdec-config")
    )


def _draft(o):
    return o["spec"]["template"]["spec"]["containers"][0]


def _config(o):
    return o["data"]


def _drop_env(o, name: str):
    env = _draft(o)["env"]
    env.pop(next(i for i, v in enumerate(env) if v["name"] == name))


def _set_arg(o, old: str, new: str):
    args = _draft(o)["args"]
    args[args.index(old)] = new


def _set_arg_after(o, flag: str, value: str):
    args = _draft(o)["args"]
    args[args.index(flag) + 1] = value


def _ray_worker(o):
    return o["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]


@pytest.fixture(scope="module")
def dev_cpu() -> list[dict]:
    """The dev-cpu render, unbroken: each case breaks its own copy."""
    return render("dev-cpu")


# (check, kind, name, change): each change is a mistake the check must catch.
BROKEN_MANIFESTS = [
    (check_builtin_kinds, "Deployment", "specdec-draft", lambda o: o["spec"].update(replica=2)),  # misspelt field
    (check_builtin_kinds, "RayCluster", "specdec-target", lambda o: _ray_worker(o).update(imagePullPolicy=3)),
    (
        check_custom_resources,
        "RayCluster",
        "specdec-target",
        lambda o: o["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}),
    ),
    (check_custom_resources, "RayCluster", "specdec-target", lambda o: o["spec"].update(workerGroupSpec=[])),
    (check_ports, "Service", "specdec-draft", lambda o: o["spec"]["ports"][0].update(targetPort="grcp")),
    (check_ports, "Deployment", "specdec-draft", lambda o: _draft(o)["readinessProbe"]["grpc"].update(port=50053)),
    (
        check_ports,
        "Deployment",
        "specdec-coordinator",
        lambda o: o["spec"]["template"]["metadata"]["annotations"].update({"prometheus.io/port": "9999"}),
    ),
    (check_env, "ConfigMap", CONFIG, lambda o: _config(o).pop("OTEL_EXPORTER_OTLP_ENDPOINT")),
    (check_env, "ConfigMap", CONFIG, lambda o: _config(o).update(SPECDEC_DRAFT_MAX_BATCHES="8")),
    (check_env, "ConfigMap", CONFIG, lambda o: _config(o).update(SPECDEC_CACHE_DIR="/tmp/elsewhere")),
    (check_env, "Deployment", "specdec-target-pool", lambda o: _drop_env(o, "RAY_AUTH_TOKEN")),
    (check_env, "RayCluster", "specdec-target", lambda o: o["spec"]["autoscalerOptions"].pop("env")),
    (
        check_secrets,
        "Deployment",
        "specdec-coordinator",
        lambda o: _draft(o)["env"].append({"name": "RAY_AUTH_TOKEN", "value": "abc"}),
    ),
    (
        check_references,
        "Deployment",
        "specdec-draft",
        lambda o: _draft(o)["envFrom"][0]["configMapRef"].update(name="specdec-config"),
    ),
    (check_command_lines, "Deployment", "specdec-coordinator", lambda o: _draft(o)["args"].append("--max-tokens=8")),
    (
        check_command_lines,
        "Deployment",
        "specdec-coordinator",
        lambda o: _draft(o).update(args=[a for a in _draft(o)["args"] if "specdec-draft" not in a and a != "--draft"]),
    ),
    (check_command_lines, "ConfigMap", CONFIG, lambda o: _config(o).update(SPECDEC_COORDINATOR_PIPELINE="yes")),
    (check_command_lines, "ConfigMap", CONFIG, lambda o: _config(o).update(SPECDEC_DRAFT_PORT="50052")),
    (check_command_lines, "Deployment", "specdec-target-pool", lambda o: _draft(o)["args"].__setitem__(0, "targets")),
    (
        check_command_lines,
        "Deployment",
        "specdec-target-pool",
        lambda o: _set_arg(o, "$(TARGET_MODEL)", "$(TARGET_MODLE)"),
    ),
    (
        check_wiring,
        "Deployment",
        "specdec-coordinator",
        lambda o: _draft(o)["args"].__setitem__(2, "dns:///specdec-drafts.specdec-dev.svc.cluster.local:50052"),
    ),
    (check_wiring, "Service", "specdec-draft", lambda o: o["spec"].pop("clusterIP")),
    (check_wiring, "ConfigMap", CONFIG, lambda o: _config(o).update(SPECDEC_COORDINATOR_MAX_DRAFT_TOKENS="64")),
    (
        check_wiring,
        "Deployment",
        "specdec-draft",
        lambda o: o["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=50),
    ),
    (check_wiring, "Deployment", "specdec-target-pool", lambda o: _set_arg_after(o, "--metrics-host", "127.0.0.1")),
    (check_autoscaling, "Deployment", "specdec-draft", lambda o: o["spec"].update(replicas=3)),
    (
        check_autoscaling,
        "PodDisruptionBudget",
        "specdec-coordinator",
        lambda o: o["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/name": "coordinator"}),
    ),
    (check_ray_versions, "RayCluster", "specdec-target", lambda o: o["spec"].update(rayVersion="2.59.0")),
    (
        check_tracing,
        "ConfigMap",
        CONFIG,
        lambda o: _config(o).update(OTEL_EXPORTER_OTLP_ENDPOINT="http://specdec-otel-collector:4318"),
    ),
]


@pytest.mark.parametrize(
    ("check", "kind", "name", "change"),
    BROKEN_MANIFESTS,
    ids=[f"{check.__name__}-{kind}-{i}" for i, (check, kind, _, _) in enumerate(BROKEN_MANIFESTS)],
)
def test_the_checks_catch_broken_manifests(dev_cpu, check, kind, name, change):
    assert check(dev_cpu) == [], f"{check.__name__} fails on the unbroken render"
    assert check(_break(dev_cpu, kind, name, change)) != [], f"{check.__name__} missed a broken {kind} {name}"


# (kind, name, change, why): each breaks the target tier of the dev-cpu overlay.
BROKEN_TARGET_TIERS = [
    (
        "Deployment",
        "specdec-target-pool",
        lambda o: next(v for v in _draft(o)["env"] if v["name"] == "TARGET_REPLICAS").update(value="9"),
        "too many actors for the worker group",
    ),
    ("ConfigMap", CONFIG, lambda o: _config(o).update(TARGET_CPUS_PER_ACTOR="1"), "not one actor per pod"),
    ("ConfigMap", CONFIG, lambda o: _config(o).update(TARGET_GPUS_PER_ACTOR="1"), "a GPU in the CPU overlay"),
    (
        "RayCluster",
        "specdec-target",
        lambda o: o["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": "1"}),
        "work on the head",
    ),
    (
        "RayCluster",
        "specdec-target",
        lambda o: _ray_worker(o)["ports"][1].update(name="metrics"),
        "the actor's port may not take the name KubeRay gives Ray's exporter",
    ),
]


@pytest.mark.parametrize(
    ("kind", "name", "change", "why"), BROKEN_TARGET_TIERS, ids=[case[-1] for case in BROKEN_TARGET_TIERS]
)
def test_the_target_tier_check_catches_broken_manifests(dev_cpu, kind, name, change, why):
    assert check_target_tier(_break(dev_cpu, kind, name, change), "dev-cpu") != [], why


def test_the_target_tier_check_knows_the_overlay(dev_cpu):
    assert check_target_tier(dev_cpu, "gpu") != [], (
        "the CPU overlay has no GPU workers, which the gpu check must notice"
    )


@pytest.mark.parametrize("overlay", ["dev-cpu", "gpu"])
def test_apply_works_again_after_a_configuration_change(overlay, tmp_path):
    """`kubectl apply -k` after one key of specdec.env changed: the ConfigMap gets a new hashed
    name, every object that names it changes with it, and none of those is immutable: the pool
    keeper is a Deployment, and the gpu overlay's model fill Job names no configuration, so it is
    the same object after the change (applied again, it is left as it is)."""
    copy_dir = tmp_path / "k8s"
    shutil.copytree(K8S, copy_dir)
    env = copy_dir / "base" / "specdec.env"
    env.write_text(env.read_text().replace("SPECDEC_DRAFT_MAX_BATCH=16", "SPECDEC_DRAFT_MAX_BATCH=8"))
    done = subprocess.run(
        ["kubectl", "kustomize", str(copy_dir / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    before = {(o["kind"], o["metadata"]["name"]): o for o in render(overlay)}
    after = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(done.stdout) if o}
    changed = {key for key in before.keys() & after.keys() if before[key] != after[key]}
    assert ("Deployment", "specdec-target-pool") in changed  # it names the config: it rolls
    immutable = {"Job", "CronJob", "Pod"}
    assert not [key for key in changed | (before.keys() ^ after.keys()) if key[0] in immutable]
    jobs = [key for key in before if key[0] in immutable]
    assert jobs == ([("Job", "specdec-models-fill")] if overlay == "gpu" else [])


@pytest.mark.parametrize("overlay", ["dev-cpu", "gpu"])
def test_models_on_a_claim_are_fetched_there_once_and_waited_for(overlay):
    """The gpu overlay serves a real pair from a ReadWriteMany claim the fill Job writes
    (`specdec fetch-models`); every pod that loads a model from it mounts it and waits for the
    fill. Breaking either (a pod without the mount, a model the Job does not fetch) is caught."""
    objs = render(overlay)
    assert check_models(objs) == []
    if overlay != "gpu":
        return
    config = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specdec-config"))
    assert config["data"]["TARGET_MODEL"] == "/models/Qwen3-8B"
    assert config["data"]["SPECDEC_DRAFT_DRAFT_MODEL"] == "suffix:/models/Qwen3-0.6B"
    unmounted = copy.deepcopy(objs)
    draft = next(o for o in unmounted if o["kind"] == "Deployment" and o["metadata"]["name"] == "specdec-draft")
    draft["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        m for m in draft["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["name"] != "models"
    ]
    assert any("does not mount specdec-models" in p for p in check_models(unmounted))
    unfetched = copy.deepcopy(objs)
    job = next(o for o in unfetched if o["kind"] == "Job")
    job["spec"]["template"]["spec"]["containers"][0]["args"].remove("Qwen/Qwen3-0.6B")
    assert any("which the fill Job does not fetch" in p for p in check_models(unfetched))


def test_tls_on_the_public_ports_is_one_component(tmp_path):
    """k8s/components/coordinator-tls added to an overlay: the coordinator reads its certificate
    and key (the flags' own variables) from a mounted kubernetes.io/tls Secret, and no probe
    speaks plaintext gRPC to the now TLS-only port."""
    from specdec.coordinator.__main__ import _parser

    copy_dir = tmp_path / "k8s"
    shutil.copytree(K8S, copy_dir)
    overlay = copy_dir / "overlays" / "with-tls"
    overlay.mkdir()
    overlay.joinpath("kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../gpu]\ncomponents: [../../components/coordinator-tls]\n"
    )
    done = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    objs = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert check_builtin_kinds(objs) == []
    (coordinator,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "specdec-coordinator"]
    pod = coordinator["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    flags = {a.option_strings[0]: env_name("SPECDEC_COORDINATOR_", a) for a in _parser({})._actions if a.option_strings}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"tls": "specdec-tls"} and mounts["tls"] == "/etc/specdec/tls"
    assert env[flags["--tls-cert"]] == "/etc/specdec/tls/tls.crt"  # kubernetes.io/tls Secret keys
    assert env[flags["--tls-key"]] == "/etc/specdec/tls/tls.key"
    probes = {name: c[name] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert not [name for name, probe in probes.items() if "grpc" in probe]
    assert probes["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTPS"}
