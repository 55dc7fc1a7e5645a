"""The dev-cpu manifests' own command lines and environment, run as local processes on loopback
(`manifest_pods`): a Ray head and two worker nodes (`ray start` with the RayCluster's
rayStartParams), the pool keeper and three coordinators (each joining Ray as a node of its own),
the draft server, each restarted when it exits, as its pod would be.

Checked, in this order, on one cluster: with the head's Ray Client server frozen (nothing uses
it), 3 coordinators x 6 concurrent streams complete (verify calls never touch the head) and
spread over the two actors (9 +- 2 sessions each); an actor killed mid-stream, and the pool
resized 1 -> 2 -> 1 under load, fail no request; after the head is killed and restarted, calls in
flight complete or get UNAVAILABLE and new calls succeed again within 60 s. Every output that
completes equals the single-process engine's.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import grpc
import pytest
import ray._private.services
from manifest_pods import (
    Pod,
    RayNodePod,
    client_server_pids,
    listener_pid,
    pod_env,
    ray_start,
    rendered,
    with_flag,
)
from stackkit import REQUESTS, Outcome, Streams, scrape, until, wait_serving

from specdec.coordinator.convert import request_from_proto
from specdec.local.in_process import build_engine
from specdec.target_service.ray_cluster import free_port, gcs_reachable, recorded_ray_address, restore_ray_address

TARGET_SEED = 1  # the reliability conftest's target
START_S = 180.0
RECOVERY_S = 60.0  # after a head restart, new calls succeed again within this
# Keeper and coordinators run niced on this one host, behind the Ray nodes: when a head restart
# restarts every process at once, a Ray node whose agents do not start within Ray's fixed 15 s
# exits and starts over (in a cluster each pod has cores of its own).
BEHIND_RAY = 10
ACTOR_PORTS = 8  # actors serve metrics on the first free ports from the keeper's --metrics-port


@dataclass
class Cluster:
    pods: dict[str, Pod]
    coordinators: list[str]
    client_port: int  # the head's Ray Client server
    metrics_port: int
    keeper_argv: list[str]
    keeper_env: dict[str, str]
    logs: object
    expected: list[list[int]] = field(default_factory=list)

    def actors(self) -> list[int]:
        """The metrics ports of the target actors alive now."""
        return [p for p in range(self.metrics_port, self.metrics_port + ACTOR_PORTS) if _sessions(p) is not None]

    def keeper(self, replicas: int) -> None:
        """Roll the keeper to `replicas` actors, as an operator pins the pool's size (the keeper's
        args with `--autoscale off`, and `kubectl set env deployment/specdec-target-pool
        TARGET_REPLICAS=N`): the old keeper stops, a new one starts with the new count. Pinned,
        since these tests set the size themselves; the load-driven size is test_load_signals'."""
        if "keeper" in self.pods:
            self.pods["keeper"].stop()
        argv = with_flag(with_flag(self.keeper_argv, "--autoscale", "off"), "--replicas", str(replicas))
        self.pods["keeper"] = Pod(
            f"keeper-{replicas}-{time.monotonic():.0f}", [sys.executable, "-m", "specdec.cli.app", *argv],
            self.keeper_env, self.logs, niceness=BEHIND_RAY,
        )  # fmt: skip
        self.pods["keeper"].wait_for(r"target pool specdec-target", START_S)


@pytest.fixture(scope="module")
def cluster(tiny_dir, tiny, tmp_path_factory):
    logs = tmp_path_factory.mktemp("manifest-cluster")
    cache = logs / "cache"
    roles, params = rendered()
    host = ray._private.services.get_node_ip_address()
    gcs, client = free_port(), free_port()
    pods: dict[str, Pod] = {}  # every pod started, each added as it starts: the finally stops them all
    previous = recorded_ray_address()
    try:
        _start_ray_nodes(pods, roles, params, cache, logs, host, gcs, client)
        cluster = _start_keeper(pods, roles["target-pool"], cache, logs, f"{host}:{gcs}", client, tiny_dir)
        draft_port = _start_draft(pods, roles["draft"], cache, logs)
        _start_coordinators(cluster, roles["coordinator"], cache, f"{host}:{gcs}", draft_port)
        engine = build_engine(tiny("llama", TARGET_SEED), None)
        cluster.expected = [asyncio.run(engine.generate(request_from_proto(r))).token_ids for r in REQUESTS]
        yield cluster
    finally:
        for name in sorted(pods, key=lambda n: ("head" in n, "worker" in n)):  # the head goes last
            pods[name].stop(signal.SIGKILL if name == "draft" else signal.SIGTERM)
        restore_ray_address(previous)


def _start_ray_nodes(pods: dict[str, Pod], roles, params, cache, logs, host: str, gcs: int, client: int) -> None:
    """The RayCluster's head and two workers, `ray start` with its rayStartParams."""

    def forget_cluster() -> None:
        # A restarted head refuses to start where this host's address file and another node's
        # processes still name its address (on one host only: in a pod there are none).
        restore_ray_address(None)

    head = ["--head", "--port", str(gcs), "--ray-client-server-port", str(client), "--include-dashboard", "false"]
    pods["head"] = RayNodePod(
        "head", ray_start(params["head"], head), pod_env(roles["target-head"][1], cache), logs,
        restart_after_s=3.0, before_start=forget_cluster,
    )  # fmt: skip
    pods["head"].wait_for("Ray runtime started", START_S)
    for i in range(2):
        pods[f"worker-{i}"] = RayNodePod(
            f"worker-{i}", ray_start(params["worker"], ["--address", f"{host}:{gcs}"]),
            pod_env(roles["target-worker"][1], cache), logs, restart_after_s=0.5 + 3 * i,
            before_start=lambda: gcs_reachable(f"{host}:{gcs}", START_S),  # KubeRay's wait-gcs-ready
        )  # fmt: skip
        pods[f"worker-{i}"].wait_for("Ray runtime started", START_S)


def _start_keeper(pods: dict[str, Pod], role, cache, logs, gcs_address: str, client: int, tiny_dir) -> Cluster:
    """The pool keeper with two actors, joined to the head's GCS; `role` is its (argv, env)."""
    argv, env = role
    argv = with_flag(argv, "--ray-join", gcs_address)
    argv = with_flag(argv, "--target-model", tiny_dir("llama", TARGET_SEED))
    metrics_port = free_port()  # the actors take the first free ports from here on
    argv = with_flag(with_flag(argv, "--metrics-host", "127.0.0.1"), "--metrics-port", str(metrics_port))
    cluster = Cluster(pods, [], client, metrics_port, argv, pod_env(env, cache), logs)
    cluster.keeper(2)
    return cluster


def _start_draft(pods: dict[str, Pod], role, cache, logs) -> int:
    """The draft server on loopback; `role` is its (argv, env). Returns its port."""
    argv, env = role
    draft_port = free_port()
    argv = with_flag(with_flag(argv, "--host", "127.0.0.1"), "--port", str(draft_port))
    argv = with_flag(argv, "--metrics-port", str(free_port()))
    pods["draft"] = Pod("draft", [sys.executable, "-m", "specdec.cli.app", *argv], pod_env(env, cache), logs)
    return draft_port


def _start_coordinators(cluster: Cluster, role, cache, gcs_address: str, draft_port: int) -> None:
    """Three coordinators, each a Ray node of its own, serving on loopback; `role` is their
    (argv, env). Their addresses go into cluster.coordinators once each serves."""
    argv, env = role
    argv = with_flag(with_flag(argv, "--draft", f"127.0.0.1:{draft_port}"), "--ray-join", gcs_address)
    argv = with_flag(with_flag(argv, "--host", "127.0.0.1"), "--grace", "1")
    for i in range(3):
        port = free_port()
        mine = with_flag(with_flag(with_flag(argv, "--port", str(port)), "--http-port", "0"), "--metrics-port", "0")
        # Restarts staggered, and first starts one at a time: Ray nodes starting at once on one
        # host race for the same worker ports (a pod is a host of its own).
        cluster.pods[f"coordinator-{i}"] = Pod(
            f"coordinator-{i}", [sys.executable, "-m", "specdec.cli.app", *mine], pod_env(env, cache), cluster.logs,
            restart_after_s=5.0 + 10 * i, niceness=BEHIND_RAY,
        )  # fmt: skip
        cluster.pods[f"coordinator-{i}"].wait_for("coordinator listening on", START_S)
        wait_serving(f"127.0.0.1:{port}", START_S)
        cluster.coordinators.append(f"127.0.0.1:{port}")


def _sessions(port: int) -> float | None:
    """The sessions a target actor holds, from its /metrics on `port` (None: no actor there; the
    ports above the actors' may be any process's on this host, a Ray node's free ones included,
    which may answer with anything but HTTP)."""
    try:
        return scrape(f"127.0.0.1:{port}").get("specdec:target_sessions")
    except (OSError, http.client.HTTPException, ValueError):
        return None


def _runs(cluster: Cluster) -> dict[str, tuple[int, str]]:
    """Each pod's runs so far and the last lines of its current run (what a failure shows)."""
    return {name: (pod.runs, pod.text()[-600:]) for name, pod in cluster.pods.items()}


def _assert_expected(outcomes: list[Outcome], cluster: Cluster, label: str) -> None:
    for i, (outcome, want) in enumerate(zip(outcomes, cluster.expected)):
        assert outcome.code == grpc.StatusCode.OK, (label, i, outcome.code, outcome.details)
        assert outcome.tokens == want, (label, i, len(outcome.tokens), len(want))


def _streams(cluster: Cluster) -> list[Streams]:
    return [Streams(address, REQUESTS).start() for address in cluster.coordinators]


@pytest.mark.long  # a Ray head, two worker nodes, the keeper, a draft server, 3 coordinators with Ray nodes
def test_the_rendered_manifests_serve_on_loopback_without_the_head_on_the_data_plane(cluster):
    actors = cluster.actors()
    # Coordinators and keeper join as Ray nodes: nothing uses the head's client server, which is
    # frozen (SIGSTOP: killed, it would take the head down with it): from here on a call through
    # the head would hang.
    servers = client_server_pids(cluster.client_port)
    assert servers, "the head runs no Ray Client server to freeze"
    for pid in servers:
        os.kill(pid, signal.SIGSTOP)
    try:
        streams = _streams(cluster)
        for s in streams:
            s.wait_messages(1, timeout_s=120)
        sessions = [_sessions(port) for port in actors]
        for i, s in enumerate(streams):
            _assert_expected(s.join(), cluster, f"coordinator {i}")
    finally:
        for pid in servers:
            os.kill(pid, signal.SIGCONT)
    assert len(sessions) == 2 and sum(sessions) == 18, sessions
    assert all(7 <= n <= 11 for n in sessions), sessions
    print(f"\n3 coordinators x {len(REQUESTS)} streams, head client server frozen: sessions per actor {sessions}")


@pytest.mark.long
def test_an_actor_killed_mid_stream_fails_no_request(cluster):
    actors = cluster.actors()
    assert len(actors) == 2, actors
    streams = _streams(cluster)
    for s in streams:
        s.wait_messages(2, timeout_s=120)
    victim = listener_pid(actors[0])
    assert victim is not None, f"no process listens on the actor's metrics port {actors[0]}"
    os.kill(victim, signal.SIGKILL)
    for i, s in enumerate(streams):
        _assert_expected(s.join(), cluster, f"coordinator {i}")
    took = until(lambda: len(cluster.actors()) == 2, START_S, "two actors again after the kill")
    print(f"\nactor killed mid-stream: 18 streams complete, two actors again {took:.0f} s after the streams")


class Load:
    """Every coordinator serving the six requests again and again until `stop`: every outcome kept."""

    def __init__(self, cluster: Cluster):
        self.cluster, self.outcomes = cluster, []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(a,), daemon=True) for a in cluster.coordinators]
        for thread in self._threads:
            thread.start()

    def _run(self, address: str) -> None:
        while not self._stop.is_set():
            self.outcomes.append(Streams(address, REQUESTS).start().join())

    def stop(self) -> list[list[Outcome]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(300)
        return self.outcomes


@pytest.mark.long
def test_resizing_the_pool_1_2_1_under_load_fails_no_request(cluster):
    load = Load(cluster)
    sizes = []
    try:
        for replicas in (1, 2, 1):
            cluster.keeper(replicas)
            until(lambda: len(cluster.actors()) == replicas, START_S, f"{replicas} actors")  # noqa: B023
            sizes.append(len(cluster.actors()))
            time.sleep(3)  # streams run on the resized pool for a while
    finally:
        waves = load.stop()
        cluster.keeper(2)
    assert sizes == [1, 2, 1]
    assert len(waves) >= 3, f"only {len(waves)} waves of streams ran across the resizes"
    for i, wave in enumerate(waves):
        _assert_expected(wave, cluster, f"wave {i}")
    print(f"\npool 2 -> 1 -> 2 -> 1 under load: {len(waves)} waves of 6 streams, all complete and equal")


@pytest.mark.long  # last: the cluster it leaves is a new one
def test_after_a_head_restart_new_calls_succeed_within_a_minute(cluster):
    until(lambda: len(cluster.actors()) == 2, START_S, "two actors before the head goes")
    head = cluster.pods["head"]
    streams = [Streams(address, REQUESTS[:2]).start() for address in cluster.coordinators]
    for s in streams:
        s.wait_messages(2, timeout_s=120)
    runs = {name: pod.runs for name, pod in cluster.pods.items()}
    head.kill()  # restarted by its supervisor 3 s later, as a new cluster (no GCS fault tolerance)
    until(lambda: head.runs == 2, 30, "the head restarted")
    head.wait_for("Ray runtime started", START_S)
    restarted = time.monotonic()
    in_flight = [o for s in streams for o in s.join()]
    # Calls in flight: each completes with the unfaulted output, or ends UNAVAILABLE.
    for i, outcome in enumerate(in_flight):
        assert outcome.code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), (i, outcome.code, outcome.details)
        if outcome.code == grpc.StatusCode.OK:
            assert outcome.tokens == cluster.expected[i % 2], i
    # New calls, one every second through the coordinators in turn (as a Service spreads them),
    # until one succeeds on a coordinator that joined the new cluster (restarted since the kill).
    probes: list[tuple[float, int, Outcome]] = []
    recovered = None
    while recovered is None and time.monotonic() - restarted < 3 * RECOVERY_S:
        for i, address in enumerate(cluster.coordinators):
            rejoined = cluster.pods[f"coordinator-{i}"].runs > runs[f"coordinator-{i}"]
            (outcome,) = Streams(address, REQUESTS[:1], timeout_s=60).start().join()
            probes.append((time.monotonic() - restarted, i, outcome))
            assert outcome.code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), (outcome.code, outcome.details)
            if outcome.code == grpc.StatusCode.OK:
                assert outcome.tokens == cluster.expected[0]
                if rejoined:
                    recovered = probes[-1][0]
                    break
            time.sleep(1)
    codes = [(round(t), i, o.code.name) for t, i, o in probes]
    completed = sum(o.code == grpc.StatusCode.OK for o in in_flight)
    print(
        f"\nhead restarted: {completed}/{len(in_flight)} in flight completed; "
        f"probes (s after restart, coordinator, code): {codes}"
    )
    assert recovered is not None and recovered <= RECOVERY_S, (codes, _runs(cluster))
