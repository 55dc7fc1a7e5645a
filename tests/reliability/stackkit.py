"""The local stack taken apart so that each part can fail on purpose, and clients that record
every delta of every stream.

`DraftProcess` is `python -m specdec.draft_service` (kill -9, SIGTERM, SIGSTOP hit a real
process and a restart binds the same port); the target pool is named actors on the test
session's Ray; `Coordinator` runs the gRPC coordinator in a thread of this process (its engine,
pool and draft client stay inspectable) and `CoordinatorProcess` runs
`python -m specdec.coordinator` (what kill -9 hits). `Streams` runs GenerateStream calls in
threads and keeps, per call, the concatenated deltas, the final message, the status and the
time of every message.
"""

from __future__ import annotations

import asyncio
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from loop_thread import LoopThread

from specdec.coordinator.clients import DraftClient, DraftClientConfig
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.remote import connect_engine
from specdec.coordinator.server import GenerationServer, ServerConfig
from specdec.core.sampling import SamplingParams
from specdec.target_service.actor import ActorConfig, remote_actor_class
from specdec.target_service.pool import PoolConfig, TargetPool
from specdec.v1 import common_pb2, generation_pb2_grpc
from specdec.v1 import generation_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "specdec-test"  # the ray_local fixture's
POOL = "reliability-tiers"  # the fault_tiers fixture's target actor: reliability-tiers-0
TTL_S = 3.0  # fault_tiers: sessions that no coordinator ends (it died) go after this long idle
START_S = 120.0  # a process must listen and serve within this (imports and a model load on 2 busy cores)


def until(condition: Callable[[], bool], timeout_s: float, what: str | Callable[[], str] = "condition") -> float:
    """Poll what no event announces (another process's state), bounded; returns the seconds it
    took. `what` names the condition (a callable: described as things stand at the timeout)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started >= timeout_s:
            raise AssertionError(f"{what() if callable(what) else what}: not reached in {timeout_s} s")
        time.sleep(0.02)
    return time.monotonic() - started


# --- processes --------------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if env.get("RAY_AUTH_TOKEN"):
        env["RAY_AUTH_MODE"] = "token"  # join the test's Ray with the token this process holds
    return env


class _Process:
    """A child process whose stdout lines are read by a thread, so a wait for a line is bounded."""

    def __init__(self, args: list[str]):
        self.args = args
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=ROOT, env=child_env()
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def line(self, containing: str, timeout_s: float = START_S) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"{self.args[2]}: no line with {containing!r} in {timeout_s} s") from None
            if line is None:
                raise AssertionError(
                    f"{self.args[2]} exited with code {self.process.wait()} before printing {containing!r}"
                )
            if containing in line:
                return line.strip()

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)

    def kill(self) -> None:
        """kill -9, and reap it."""
        self.signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        """Whatever state it is in (stopped included): gone when this returns."""
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


class DraftProcess(_Process):
    """`python -m specdec.draft_service` on `port` (0: any); returns once its health says SERVING."""

    def __init__(self, port: int = 0, draft_model: str = "ngram", flags: Sequence[str] = ()):
        args = [
            sys.executable,
            "-m",
            "specdec.draft_service",
            "--draft-model",
            draft_model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            *flags,
        ]
        super().__init__(args)
        try:
            self.address = self.line(" listening on ").rsplit(" ", 1)[-1]
            self.metrics_address = self.line(" metrics on ").rsplit(" ", 1)[-1]
            wait_serving(self.address)
        except BaseException:
            self.kill()
            raise

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


class CoordinatorProcess(_Process):
    """`python -m specdec.coordinator` over a draft address and a target pool on the test's Ray."""

    def __init__(self, draft: str, pool: str, flags: Sequence[str] = ()):
        gcs = ray.get_runtime_context().gcs_address
        args = [sys.executable, "-m", "specdec.coordinator", "--draft", draft, "--target-pool", pool,
                "--namespace", NAMESPACE, "--ray-address", gcs, "--host", "127.0.0.1", "--port", "0",
                "--metrics-port", "0", *flags]  # fmt: skip
        super().__init__(args)
        try:
            self.address = self.line("coordinator listening on ").split()[3]
            wait_serving(self.address)
        except BaseException:
            self.kill()
            raise


def wait_serving(address: str, timeout_s: float = START_S) -> None:
    """Until the server's health says SERVING (Watch streams every change: no polling)."""
    with grpc.insecure_channel(address) as channel:
        replies = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout_s, wait_for_ready=True
        )
        for reply in replies:
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                replies.cancel()
                return
    raise AssertionError(f"{address} stopped before serving")


def scrape(address: str) -> dict[str, float]:
    """Unlabelled samples of a /metrics page (name -> value)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}


# --- the target pool and an in-process coordinator -------------------------------------------------------


def launch_pool(name: str, target_model: str, **actor) -> list[ray.actor.ActorHandle]:
    """One named actor `<name>-0` on the session's Ray, as `target_service.pool.launch` makes
    them, except that it reserves no CPU: the tests' actors stay up for the whole session, and a
    reservation would starve the other test modules' actors of the local Ray's 2 CPUs."""
    cls = remote_actor_class(num_gpus=0, num_cpus=0)
    config = ActorConfig(target_model=target_model, metrics_port=0, **actor)
    handle = cls.options(name=f"{name}-0", namespace=NAMESPACE, get_if_exists=True, lifetime="detached").remote(config)
    ray.get(handle.info.remote(), timeout=START_S)
    return [handle]


def kill_pool(actors) -> None:
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


class Coordinator:
    """GenerationServer over a DraftClient and a TargetPool, on `loop`, as `specdec coordinator`
    builds it (connect_engine) but in this process so tests can look inside."""

    def __init__(
        self,
        loop: LoopThread,
        draft_address: str,
        pool: str,
        engine: EngineConfig = EngineConfig(),
        max_inflight: int = 64,
        draft_client: DraftClientConfig = DraftClientConfig(),
        pool_config: dict | None = None,
    ):
        self.loop = loop

        async def start():
            self.draft = DraftClient(draft_address, draft_client)
            self.pool = TargetPool(PoolConfig(prefix=pool, namespace=NAMESPACE, **(pool_config or {})))
            self.engine = await connect_engine(self.draft, self.pool, None, engine)
            self.server = GenerationServer(self.engine, ServerConfig(port=0, max_inflight=max_inflight))
            return await self.server.start()

        self.address = f"127.0.0.1:{loop.run(start())}"

    @property
    def stats(self):
        return self.server.stats

    def leftovers(self) -> dict[str, int]:
        """Per-request state the coordinator still holds (all zero once every call has ended)."""
        return {
            "in_flight": self.server.stats.in_flight,
            "pool_sessions": len(self.pool.sessions),
            "pool_abandoned": len(self.pool._abandoned),
            "draft_sessions": len(self.draft._sessions),
        }

    def draft_ready(self, timeout_s: float = 30.0) -> None:
        """Until the draft client's channel is connected again (after a draft restart)."""

        async def ready():
            for channel, _ in self.draft._channels.values():
                await asyncio.wait_for(channel.channel_ready(), timeout_s)

        self.loop.run(ready(), timeout_s + 5)

    def close(self) -> None:
        async def stop():
            await self.server.stop(0)
            await self.draft.close()

        self.loop.run(stop())


# --- clients ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One GenerateStream call as its client saw it."""

    tokens: list[int] = field(default_factory=list)  # every delta's token ids, concatenated
    text: str = ""  # every delta's text, concatenated
    times: list[float] = field(default_factory=list)  # monotonic arrival of each message
    final: pb.GenerateStreamResponse | None = None  # the message with the finish reason
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    started: float = 0.0
    ended: float = 0.0  # when the call's status arrived

    @property
    def messages(self) -> int:
        return len(self.times)

    @property
    def done(self) -> bool:
        return self.ended > 0

    def gaps(self) -> list[float]:
        """Seconds to the first message, between messages, and from the last to the status."""
        marks = [self.started, *self.times, self.ended]
        return [b - a for a, b in zip(marks, marks[1:])]


class Streams:
    """GenerateStream calls, each in a thread of its own, recorded as `Outcome`s."""

    def __init__(self, address: str, requests: Sequence[pb.GenerateStreamRequest], timeout_s: float = 120.0):
        self.requests = list(requests)
        self.timeout_s = timeout_s
        self.outcomes = [Outcome() for _ in self.requests]
        self._changed = threading.Condition()
        self._channel = grpc.insecure_channel(address)
        self._stub = generation_pb2_grpc.GenerationServiceStub(self._channel)
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(self.requests))]

    def start(self) -> Streams:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, i: int) -> None:
        outcome = self.outcomes[i]
        outcome.started = time.monotonic()
        try:
            for message in self._stub.GenerateStream(self.requests[i], timeout=self.timeout_s):
                with self._changed:
                    outcome.tokens.extend(message.token_ids)
                    outcome.text += message.text
                    outcome.times.append(time.monotonic())
                    if message.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                        outcome.final = message
                    self._changed.notify_all()
        except grpc.RpcError as error:
            outcome.code, outcome.details = error.code(), error.details() or ""
        finally:
            with self._changed:
                outcome.ended = time.monotonic()
                self._changed.notify_all()

    def wait(self, condition: Callable[[list[Outcome]], bool], timeout_s: float = 60.0, what: str = "streams") -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: condition(self.outcomes), timeout_s), (
                f"{what}: not reached in {timeout_s} s"
            )

    def wait_messages(self, at_least: Sequence[int] | int, timeout_s: float = 60.0) -> None:
        """Until stream i has `at_least[i]` messages or has ended."""
        wanted = [at_least] * len(self.outcomes) if isinstance(at_least, int) else list(at_least)
        self.wait(
            lambda outs: all(o.done or o.messages >= n for o, n in zip(outs, wanted)), timeout_s, f"{wanted} messages"
        )

    def snapshot(self) -> list[tuple[int, bool]]:
        """(messages so far, ended) per stream, taken atomically."""
        with self._changed:
            return [(o.messages, o.done) for o in self.outcomes]

    def join(self, timeout_s: float | None = None) -> list[Outcome]:
        deadline = time.monotonic() + (self.timeout_s + 10 if timeout_s is None else timeout_s)
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))
            assert not thread.is_alive(), "a stream did not end in time"
        self._channel.close()
        return self.outcomes


def run_streams(address: str, requests, timeout_s: float = 120.0) -> list[Outcome]:
    return Streams(address, requests, timeout_s).start().join()


def assert_same_output(got: Sequence[Outcome], expected: Sequence[Outcome], label: str = "") -> None:
    """Every call completed, and its concatenated deltas are the unfaulted call's, token for token:
    nothing lost, nothing duplicated, nothing changed."""
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        where = f"{label} stream {i}".strip()
        assert g.code == grpc.StatusCode.OK, f"{where}: {g.code} {g.details}"
        assert g.final is not None and g.final.finish_reason == e.final.finish_reason, where
        assert g.tokens == e.tokens, f"{where}: {len(g.tokens)} tokens, expected {len(e.tokens)}"
        assert g.text == e.text, where
        assert g.final.usage.completion_tokens == len(g.tokens), f"{where}: usage disagrees with the deltas"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least a fraction q of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


# --- the stack the fault and slow tests share -------------------------------------------------------------

PROMPTS = [
    [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17],
    [9, 8, 7, 9, 8, 7, 1, 9, 8],
    [200, 3, 200, 4, 200, 3, 200],
]
GREEDY = common_pb2.SamplingParams()
# float32-exact values (as in tests/stack/test_coordinator.py), a seed per prompt
SEEDED = [common_pb2.SamplingParams(temperature=0.75, top_k=50, top_p=0.875, seed=seed) for seed in (11, 12, 13)]


def stream_requests(max_new_tokens: int, max_draft_tokens: int = 4) -> list[pb.GenerateStreamRequest]:
    """A greedy and a seeded stream per prompt."""
    speculation = pb.SpeculationParams(max_draft_tokens=max_draft_tokens)
    return [
        pb.GenerateStreamRequest(
            prompt_token_ids=prompt, max_new_tokens=max_new_tokens, sampling=sampling, speculation=speculation
        )
        for prompt, seeded in zip(PROMPTS, SEEDED)
        for sampling in (GREEDY, seeded)
    ]


REQUESTS = stream_requests(max_new_tokens=128)  # a few seconds each, six at once, on 2 cores


def sampling_of(request) -> SamplingParams:
    s = request.sampling
    return SamplingParams(
        temperature=s.temperature, top_p=s.top_p or 1.0, top_k=s.top_k, seed=s.seed if s.HasField("seed") else None
    )


class Tiers:
    """A draft server process (n-gram) and one target actor, both with a short session TTL; the
    tests' coordinators run over them (`Stack`)."""

    def __init__(self, target_model: str, pool: str, ttl_s: float, **actor):
        self.loop = LoopThread()
        self.pool_name = pool
        self.draft_flags = ["--session-ttl", str(ttl_s)]
        self.actors, self.draft = [], None
        try:
            self.actors = launch_pool(pool, target_model, session_ttl_s=ttl_s, **actor)
            self.draft = DraftProcess(flags=self.draft_flags)
        except BaseException:
            self.close()
            raise

    @property
    def actor(self):
        return self.actors[0]

    def actor_info(self) -> dict:
        return ray.get(self.actor.info.remote(), timeout=60)

    def restart_draft(self) -> None:
        """A new draft server process on the port the coordinators know."""
        port = self.draft.port
        self.draft = DraftProcess(port, flags=self.draft_flags)

    def kill_actor(self) -> None:
        """Kill the actor's process; Ray starts it again (empty caches)."""
        ray.kill(self.actor, no_restart=False)

    def heal(self) -> None:
        """Undo what a failed test may have left behind: a stopped or dead draft server."""
        self.draft.signal(signal.SIGCONT)
        if self.draft.process.poll() is not None:
            self.restart_draft()

    def close(self) -> None:
        if self.draft is not None:
            self.draft.stop()
        kill_pool(self.actors)
        self.loop.close()


class Stack:
    """A coordinator in this process over `Tiers`."""

    def __init__(self, tiers: Tiers, engine: EngineConfig = EngineConfig(), max_inflight: int = 64):
        tiers.heal()
        self.tiers = tiers
        self.coordinator = Coordinator(tiers.loop, tiers.draft.address, tiers.pool_name, engine, max_inflight)

    def held(self) -> dict[str, int]:
        """Calls in flight and sessions held on every tier (all zero when nothing is left behind)."""
        return {
            **self.coordinator.leftovers(),
            "actor_sessions": self.tiers.actor_info()["sessions"],
            "draft_server_sessions": int(scrape(self.tiers.draft.metrics_address)["specdec:draft_sessions"]),
        }

    def assert_clean(self, timeout_s: float = 10.0) -> float:
        """Nothing left behind, at most `timeout_s` after the last call ended (a session the
        coordinator ends in the background, after a slow tier, may take a moment); returns the
        seconds it took."""
        return until(
            lambda: not any(self.held().values()), timeout_s, lambda: f"nothing held on any tier (held: {self.held()})"
        )

    def close(self) -> None:
        self.coordinator.close()


def expected_outcomes(stack: Stack, requests, target) -> list[Outcome]:
    """The unfaulted run of `requests` through `stack`, each checked against the single-process
    engine over `target` (the LoadedModel the actor serves)."""
    from specdec.coordinator.convert import request_from_proto
    from specdec.local.in_process import build_engine

    outcomes = run_streams(stack.coordinator.address, requests)
    engine = build_engine(target, None)
    for request, outcome in zip(requests, outcomes):
        assert outcome.code == grpc.StatusCode.OK, (outcome.code, outcome.details)
        alone = asyncio.run(engine.generate(request_from_proto(request)))
        assert outcome.tokens == alone.token_ids and outcome.text == alone.text
        assert outcome.final.speculation.draft_tokens > 0
    stack.assert_clean()
    return outcomes
