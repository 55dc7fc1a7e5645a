"""The dev-cpu manifests' own command lines and environment, run as local processes on loopback:
a Ray head and two worker nodes (`ray start` with the RayCluster's rayStartParams), the pool
keeper, the draft server and three coordinators (each joining Ray as a node of its own). Only
what cannot hold on one host changes: service names become 127.0.0.1 or the host's Ray address,
fixed ports become free ones, the model is the tiny test model, secrets are the test's own, the
Ray dashboard is off and tracing has no collector.

Checked: the keeper creates the pool; with the keeper gone and the head's Ray Client server
frozen, all three coordinators still serve (their verify calls never touch the head's client
server); 3 coordinators x 6 concurrent streams spread over the two actors (9 +- 2 each, as the
actors count their sessions); every output equals the single-process engine's.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import ray._private.services
from stackkit import REQUESTS, ROOT, Streams, scrape, until, wait_serving

from specdec.coordinator.convert import request_from_proto
from specdec.local.in_process import build_engine
from specdec.target_service.ray_cluster import (
    NODE_PORTS,
    free_node_ports,
    free_port,
    recorded_ray_address,
    restore_ray_address,
)

sys.path.insert(0, str(ROOT / "tests" / "deploy"))
from k8s_objects import command_line, containers, find, render  # noqa: E402

TARGET_SEED = 1  # the reliability conftest's target
TOKEN = "manifest-cluster-test-token"
START_S = 180.0


class Proc:
    """A child process in a session of its own (stopped with its whole group), output to a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path):
        self.name, self.log = name, logs / f"{name}.log"
        self.process = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float = START_S) -> re.Match:
        found: list[re.Match] = []

        def seen() -> bool:
            assert self.process.poll() is None, f"{self.name} exited: {self.text()[-3000:]}"
            found[:] = [m for m in [re.search(pattern, self.text())] if m]
            return bool(found)

        until(seen, timeout_s, f"{self.name} printing {pattern!r}")
        return found[0]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def _rendered() -> tuple[dict[str, tuple[list[str], dict[str, str]]], dict[str, dict[str, str]]]:
    """The dev-cpu overlay's role -> (argv, environment) of its first container, and the
    RayCluster's rayStartParams of the head and of the worker group."""
    objs = render("dev-cpu")
    roles = {}
    for owner, role, template, c in containers(objs):
        if template is not None and role not in roles:
            roles[role] = command_line(objs, owner, c)
    (rc,) = find(objs, "RayCluster")
    head, worker = rc["spec"]["headGroupSpec"], rc["spec"]["workerGroupSpecs"][0]
    return roles, {"head": head["rayStartParams"], "worker": worker["rayStartParams"]}


def _env(rendered_env: dict[str, str], cache: Path) -> dict[str, str]:
    env = {k: v for k, v in rendered_env.items() if not v.startswith("<secret")}
    env.update(
        PATH=os.environ["PATH"],
        HOME=os.environ.get("HOME", "/tmp"),
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        SPECDEC_CACHE_DIR=str(cache),
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=TOKEN,
        OTEL_SDK_DISABLED="true",  # no collector here
    )
    return env


def _flag(argv: list[str], name: str, value: str) -> list[str]:
    """argv with flag `name` given `value` (replaced where present, else appended)."""
    argv = list(argv)
    if name in argv:
        argv[argv.index(name) + 1] = value
    else:
        argv += [name, value]
    return argv


def _ray_start(params: dict[str, str], extra: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats", *extra]
    for key, value in params.items():
        if key == "dashboard-host" or key in NODE_PORTS:
            continue  # the dashboard is off here; ports are free ones of this host
        argv += [f"--{key}", value]
    return argv + free_node_ports()


@pytest.fixture(scope="module")
def cluster(tiny_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("manifest-cluster")
    cache = logs / "cache"
    rendered, params = _rendered()
    host = ray._private.services.get_node_ip_address()
    gcs, client = free_port(), free_port()
    procs: dict[str, Proc] = {}
    previous = recorded_ray_address()
    try:
        head_env = _env(rendered["target-head"][1], cache)
        procs["head"] = Proc(
            "head",
            _ray_start(
                params["head"],
                ["--head", "--port", str(gcs), "--ray-client-server-port", str(client), "--include-dashboard", "false"],
            ),  # fmt: skip
            head_env,
            logs,
        )
        procs["head"].wait_for("Ray runtime started")
        worker_env = _env(rendered["target-worker"][1], cache)
        for i in range(2):
            procs[f"worker-{i}"] = Proc(
                f"worker-{i}", _ray_start(params["worker"], ["--address", f"{host}:{gcs}"]), worker_env, logs
            )
            procs[f"worker-{i}"].wait_for("Ray runtime started")
        argv, env = rendered["target-pool"]
        argv = _flag(argv, "--address", f"ray://{host}:{client}")
        argv = _flag(_flag(argv, "--replicas", "2"), "--target-model", tiny_dir("llama", TARGET_SEED))
        metrics_port = free_port()  # the actors take the first free ports from here on
        argv = _flag(_flag(argv, "--metrics-host", "127.0.0.1"), "--metrics-port", str(metrics_port))
        for attempt in range(3):  # as its Deployment would, restart a keeper that exited
            procs["keeper"] = Proc(
                f"keeper-{attempt}", [sys.executable, "-m", "specdec.cli.app", *argv], _env(env, cache), logs
            )
            try:
                procs["keeper"].wait_for(r"target pool specdec-target")
                break
            except AssertionError:
                if attempt == 2 or procs["keeper"].process.poll() is None:
                    raise
        argv, env = rendered["draft"]
        draft_port = free_port()
        argv = _flag(_flag(argv, "--host", "127.0.0.1"), "--port", str(draft_port))
        argv = _flag(argv, "--metrics-port", str(free_port()))
        procs["draft"] = Proc("draft", [sys.executable, "-m", "specdec.cli.app", *argv], _env(env, cache), logs)
        argv, env = rendered["coordinator"]
        argv = _flag(_flag(argv, "--draft", f"127.0.0.1:{draft_port}"), "--ray-join", f"{host}:{gcs}")
        argv = _flag(_flag(argv, "--host", "127.0.0.1"), "--grace", "1")
        coordinators = []
        for i in range(3):
            port = free_port()
            mine = _flag(_flag(_flag(argv, "--port", str(port)), "--http-port", "0"), "--metrics-port", "0")
            procs[f"coordinator-{i}"] = Proc(
                f"coordinator-{i}", [sys.executable, "-m", "specdec.cli.app", *mine], _env(env, cache), logs
            )
            # One at a time: nodes started at once on one host race for the same ports (a pod is
            # a host of its own).
            procs[f"coordinator-{i}"].wait_for("coordinator listening on")
            wait_serving(f"127.0.0.1:{port}", START_S)
            coordinators.append(f"127.0.0.1:{port}")
        yield procs, coordinators, client, metrics_port
    finally:
        for name in sorted(procs, key=lambda n: ("head" in n, "worker" in n)):  # the head goes last
            procs[name].stop(signal.SIGKILL if name == "draft" else signal.SIGTERM)
        restore_ray_address(previous)


def _client_server_pids(port: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "ray.util.client.server" in cmdline and f"--port={port}" in cmdline:
                pids.append(int(proc.name))
    return pids


@pytest.mark.long  # a Ray head, two worker nodes, the keeper, a draft server, 3 coordinators with Ray nodes
def test_the_rendered_manifests_serve_on_loopback_without_the_head_on_the_data_plane(cluster, tiny):
    procs, coordinators, client_port, metrics_port = cluster
    actors = [port for port in range(metrics_port, metrics_port + 8) if _sessions(port) is not None]
    # The keeper (a Ray Client) goes, and with it the last user of the head's client server, which
    # is then frozen (SIGSTOP: killed, it would take the head down with it): from here on a call
    # through the head would hang.
    procs["keeper"].stop()
    servers = _client_server_pids(client_port)
    assert servers, "the head runs no Ray Client server to freeze"
    for pid in servers:
        os.kill(pid, signal.SIGSTOP)
    try:
        _serve_through_three_coordinators(coordinators, actors, tiny)
    finally:
        for pid in servers:
            os.kill(pid, signal.SIGCONT)


def _serve_through_three_coordinators(coordinators, actors, tiny) -> None:
    engine = build_engine(tiny("llama", TARGET_SEED), None)
    expected = [asyncio.run(engine.generate(request_from_proto(r))).token_ids for r in REQUESTS]
    streams = [Streams(address, REQUESTS).start() for address in coordinators]
    for s in streams:
        s.wait_messages(1, timeout_s=120)
    sessions = [_sessions(port) for port in actors]
    outcomes = [s.join() for s in streams]
    for per_coordinator in outcomes:
        for outcome, want in zip(per_coordinator, expected):
            assert outcome.code == grpc.StatusCode.OK, (outcome.code, outcome.details)
            assert outcome.tokens == want
    assert len(sessions) == 2 and sum(sessions) == 18, sessions
    assert all(7 <= n <= 11 for n in sessions), sessions
    print(f"\n3 coordinators x {len(REQUESTS)} streams, head client server frozen: sessions per actor {sessions}")


def _sessions(port: int) -> float | None:
    """The sessions a target actor holds, from its /metrics on `port` (None: no actor there)."""
    try:
        return scrape(f"127.0.0.1:{port}").get("specdec:target_sessions")
    except OSError:
        return None
