"""Joining or starting a Ray cluster, with authentication set up on purpose.

Recent Ray turns token authentication on for new local clusters and writes a token under the
home directory. We keep that protection but decide the token ourselves: the one given in
RAY_AUTH_TOKEN (how a Kubernetes Secret reaches the pods), or a fresh random one for a local
cluster, held in this process's environment so that the workers it starts inherit it and
nothing is left on disk.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import ray
import ray._private.utils

# A driver's node holds no objects worth a store: verify calls and replies are small enough to
# travel inline. 100 MB is above Ray's minimum.
NODE_OBJECT_STORE_BYTES = 100 * 1000 * 1000


def connect(
    address: str | None,
    namespace: str,
    num_cpus: int | None = None,
    redis: str | None = None,
    redis_password: str | None = None,
) -> None:
    """Join the cluster at `address` (its auth settings come from the environment, as Ray reads
    them), or start a local one with token authentication and a token of our own; with `redis`
    (HOST:PORT), its GCS keeps the cluster's state there (GCS fault tolerance: a GCS restarted
    with the same flags comes back as the same cluster while the actors keep serving)."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace=namespace, log_to_driver=False)
        return
    # ray.init turns token mode on for a new local cluster unless RAY_AUTH_MODE says otherwise
    # (it must be set before ray is imported to take effect); our token is the one it finds.
    if os.environ.get("RAY_AUTH_MODE", "token") == "token":
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    extra = {}
    if redis:
        # Ray's head reads the store from its environment, and the GCS process inherits it. A
        # namespace of this cluster's own: a new local cluster must not load the state an
        # earlier one left in the same Redis (its nodes and actors are gone).
        os.environ["RAY_REDIS_ADDRESS"] = redis
        os.environ.setdefault("RAY_external_storage_namespace", f"specdec-{secrets.token_hex(8)}")
        extra["_redis_password"] = redis_password or ""
    # address="local": always a new cluster, never one a stale address file (a `ray start` that
    # crashed, another test run) names.
    ray.init(
        address="local", num_cpus=num_cpus, namespace=namespace, include_dashboard=False, log_to_driver=False, **extra
    )


class RayNode:
    """A Ray node of this process's own, joined to the cluster whose GCS is at `gcs_address`, and
    this process connected to the cluster as a driver on it (`with RayNode(...)`; leaving ends
    the node).

    The node offers no CPUs and no GPUs, so nothing is ever scheduled on it: it exists so that
    this process is a driver, whose actor calls go from its own core worker to the actors'
    directly. A Ray Client (`ray://`) instead sends every call through the head's client server,
    which unpickles and resubmits it. The node's own ports are chosen free here (`ray start`
    fixes some and races for others), so it can share a host with other nodes.
    """

    def __init__(self, gcs_address: str, namespace: str, timeout_s: float = 60, check_s: float = 2.0):
        self.gcs_address, self.namespace, self.timeout_s, self.check_s = gcs_address, namespace, timeout_s, check_s
        self.process: subprocess.Popen | None = None
        self._previous_address: str | None = None
        self._left = threading.Event()
        self._replaced = threading.Event()

    def __enter__(self) -> RayNode:
        # A node started while the head is down (restarting) fails only after Ray's own startup
        # wait; first wait for the GCS port, as KubeRay's workers do in an init container.
        if not gcs_reachable(self.gcs_address, self.timeout_s):
            raise RuntimeError(
                f"the Ray head's GCS at {self.gcs_address} did not accept a connection in {self.timeout_s:.0f} s"
            )
        self._previous_address = recorded_ray_address()
        command = [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
            "--address", self.gcs_address, "--num-cpus", "0", "--num-gpus", "0",
            "--object-store-memory", str(NODE_OBJECT_STORE_BYTES),
        ]  # fmt: skip
        command += free_node_ports()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output: list[str] = []
        started = threading.Event()

        def read() -> None:  # until the node ends: a full pipe would block it
            for line in self.process.stdout:
                output.append(line)
                if "Ray runtime started" in line:
                    started.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + self.timeout_s
        try:
            while not started.wait(0.2):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"ray start --address {self.gcs_address} did not start a node: {''.join(output[-20:])}"
                    )
            ray.init(address=self.gcs_address, namespace=self.namespace, log_to_driver=False)
            watch_cluster(self.gcs_address, self._replaced.set, self._left, self.check_s)
            return self
        except BaseException:
            self.__exit__()
            raise

    def ended(self) -> bool:
        """Whether this process is cut off from the cluster for good: its node has exited (the
        head gone too long), or the head answers as a new cluster (restarted without GCS fault
        tolerance; the node's raylet notices only 2 to 50 s later, and until this process leaves,
        its driver keeps sending the new head requests it rejects, thousands a second)."""
        return self._replaced.is_set() or (self.process is not None and self.process.poll() is not None)

    def leave(self, wait_s: float = 0.0, why: str = "") -> None:
        """End the node, and the process too (exit status 1) where it is cut off from the cluster
        for good (`ended`), printing `why`: Ray's exit hooks would only wait on the lost cluster,
        and the supervisor's restart joins the new one. A call that failed on a lost cluster can
        beat the watcher (it checks every `check_s`) to it: `wait_s` gives the watcher that long
        to tell, since leaving such a cluster gracefully would hang in Ray's shutdown."""
        deadline = time.monotonic() + wait_s
        while not self.ended() and time.monotonic() < deadline:
            time.sleep(0.5)
        lost = self.ended()
        if lost and why:
            print(why, file=sys.stderr, flush=True)
        self.__exit__()
        if lost:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def __exit__(self, *exc) -> None:
        self._left.set()
        replaced = self._replaced.is_set()
        if ray.is_initialized() and not replaced:  # a replaced cluster's driver can only hang in it
            ray.shutdown()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # `ray start --block` ends its node's processes on SIGTERM
            try:
                self.process.wait(timeout=5 if replaced else 30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        restore_ray_address(self._previous_address)


def watch_cluster(
    gcs_address: str, on_replaced: Callable[[], None], stop: threading.Event, every_s: float = 2.0
) -> None:
    """Call `on_replaced` (once, from a thread of its own) when the head at `gcs_address` answers
    as another cluster than the one this process joined: a head restarted without GCS fault
    tolerance starts a new cluster, and nothing of the old one (nodes, drivers, actors) can
    rejoin it. Ray's own processes find out 2 to 50 s later, meanwhile sending the new head
    requests it rejects, thousands a second. Checked every `every_s` until `stop` is set."""
    joined = ray._private.worker.global_worker.node.cluster_id.hex()

    def watch() -> None:
        from ray._raylet import GcsClient

        while not stop.wait(every_s):
            if not gcs_reachable(gcs_address, 0):
                continue  # down: it may come back as the same cluster (GCS fault tolerance)
            try:
                current = GcsClient(address=gcs_address).cluster_id.hex()
            except Exception:  # noqa: BLE001 - starting up or going down: ask again later
                continue
            if current != joined:
                on_replaced()
                return

    threading.Thread(target=watch, name="watch-cluster", daemon=True).start()


def gcs_reachable(address: str, timeout_s: float) -> bool:
    """Whether a TCP connection to `address` (HOST:PORT) succeeds within `timeout_s`, tried
    every 0.5 s."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def _address_file() -> Path:
    return Path(ray._private.utils.get_ray_address_file(None))


def recorded_ray_address() -> str | None:
    """The cluster address `ray start` last recorded on this host, where a later `ray.init()` with
    no address looks for a cluster to join (None: none recorded)."""
    path = _address_file()
    return path.read_text() if path.exists() else None


def restore_ray_address(previous: str | None) -> None:
    """Put the recorded address back as `recorded_ray_address` found it: a `ray start` that
    joined a cluster for a while must not leave later `ray.init()` calls pointed at it."""
    if previous is None:
        _address_file().unlink(missing_ok=True)
    else:
        _address_file().write_text(previous)


def free_port() -> int:
    """A TCP port free on this host now (for a process that will bind it in a moment)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "runtime-env-agent-port",
    "dashboard-agent-grpc-port",
    "dashboard-agent-listen-port",
    "metrics-export-port",
)


def free_node_ports() -> list[str]:
    """`ray start` arguments giving each port of a node a free one of this host."""
    return [arg for name in NODE_PORTS for arg in (f"--{name}", str(free_port()))]
