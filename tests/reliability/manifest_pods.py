"""The dev-cpu overlay's pods as local processes: each rendered container's command line and
environment, run under a supervisor that restarts it when it exits, as Kubernetes restarts a
pod's container (restartPolicy Always). Only what one host forces changes: service names become
127.0.0.1 or the host's Ray address, fixed ports become free ones, the Ray dashboard is off and
tracing has no collector.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from stackkit import ROOT, until

from specdec.target_service.ray_cluster import NODE_PORTS, free_node_ports

sys.path.insert(0, str(ROOT / "tests" / "deploy"))
from k8s_objects import command_line, containers, find, render  # noqa: E402

TOKEN = "manifest-cluster-test-token"


class Pod:
    """A command restarted `restart_after_s` after each exit until `stop`; each run in a session of
    its own (signalled with its whole process group) and with its output in a file of its own."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        logs: Path,
        restart_after_s: float = 2.0,
        before_start: Callable[[], None] = lambda: None,
        niceness: int = 0,
    ):
        self.name, self.argv, self.env, self.logs = name, argv, env, logs
        self.niceness = niceness
        self.restart_after_s, self.before_start = restart_after_s, before_start
        self.runs = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._start()
        threading.Thread(target=self._supervise, daemon=True).start()

    def _start(self) -> None:
        self.before_start()
        self.runs += 1
        self.started = time.monotonic()
        self.log = self.logs / f"{self.name}.{self.runs}.log"
        self.process = subprocess.Popen(
            ["nice", "-n", str(self.niceness), *self.argv] if self.niceness else self.argv,
            env=self.env,
            cwd=ROOT,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _supervise(self) -> None:
        while True:
            self.process.wait()
            if self._stopping.wait(self.restart_after_s):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                self._start()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float, runs: int = 3) -> re.Match:
        """Until this pod's current run prints `pattern`. Each run gets `timeout_s` from its own
        start, as a startup probe's clock restarts with its container: a run that fails (a Ray
        node's startup timing out on a starved host) is restarted by the supervisor and waited
        for anew, up to `runs` runs."""
        found: list[re.Match] = []
        first = self.runs

        def seen() -> bool:
            found[:] = [m for m in [re.search(pattern, self.text())] if m]
            timed_out = self.process.poll() is None and time.monotonic() - self.started >= timeout_s
            return bool(found) or timed_out or self.runs >= first + runs

        def what() -> str:
            return f"{self.name} printing {pattern!r} in {timeout_s} s of a run; run {self.runs}: {self.text()[-3000:]}"

        until(seen, timeout_s * runs + self.restart_after_s * runs, what)
        assert found, what()
        return found[0]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the current run's whole process group (the supervisor restarts it)."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
        with self._lock:
            self._stopping.set()
        if self.process.poll() is None:
            self.kill(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                self.process.wait(10)


def rendered() -> tuple[dict[str, tuple[list[str], dict[str, str]]], dict[str, dict[str, str]]]:
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


def pod_env(rendered_env: dict[str, str], cache: Path) -> dict[str, str]:
    # Without the head's Redis (GCS fault tolerance is tests/reliability/test_gcs_ft.py's): a
    # restarted head here is a new cluster, the path the processes must heal from on their own.
    env = {k: v for k, v in rendered_env.items() if not v.startswith("<secret") and k != "RAY_REDIS_ADDRESS"}
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


def with_flag(argv: list[str], name: str, value: str) -> list[str]:
    """argv with flag `name` given `value` (replaced where present, else appended)."""
    argv = list(argv)
    if name in argv:
        argv[argv.index(name) + 1] = value
    else:
        argv += [name, value]
    return argv


def ray_start(params: dict[str, str], extra: list[str]) -> list[str]:
    """`ray start --block` with a RayCluster group's rayStartParams. The node's ports are chosen
    free when each run starts (a restarted node must not count on its old ones)."""
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats", *extra]
    for key, value in params.items():
        if key in ("dashboard-host", "redis-password") or key in NODE_PORTS:
            continue  # the dashboard is off here; ports are free ones of this host; no Redis here
        argv += [f"--{key}", value]
    return argv


class RayNodePod(Pod):
    """A Ray node's pod: each run gets free node ports of its own."""

    def __init__(self, name: str, argv: list[str], *args, **kwargs):
        self.base_argv = argv
        super().__init__(name, argv, *args, **kwargs)

    def _start(self) -> None:
        self.argv = self.base_argv + free_node_ports()
        super()._start()


def client_server_pids(port: int) -> list[int]:
    """The processes of the Ray Client server listening on `port`."""
    return [pid for pid, cmdline in processes() if "ray.util.client.server" in cmdline and f"--port={port}" in cmdline]


def listener_pid(port: int) -> int | None:
    """The process listening on TCP `port` of this host (None: none)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                    return int(proc.name)
            except OSError:
                continue
    return None


def processes():
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                yield int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
