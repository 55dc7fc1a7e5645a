"""The load signals the autoscalers read (k8s/base/autoscaling.yaml, target_service/autoscale.py):
the coordinator's waiting and running requests, the draft replica's calls in progress, each target
actor's KV use and rounds, scraped from /metrics as Prometheus reads them; and the pool keeper
growing and shrinking a real pool on its actors' KV use."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import grpc
import pytest
import ray
from prometheus_client import REGISTRY
from test_observability import scrape

from specdec.coordinator.calls import CallEnded, Calls, CallSpan
from specdec.coordinator.engine import Delta, GenerationRequest
from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.draft_service.server import DraftServicer
from specdec.draft_service.service import Overloaded
from specdec.target_service.actor import ActorConfig
from specdec.target_service.autoscale import AutoscaleConfig, Autoscaler
from specdec.target_service.pool import PoolConfig, TargetPool, actor_names, keep, launch
from specdec.telemetry.metrics import MetricsServer
from specdec.v1 import draft_pb2

_names = itertools.count()


def _value(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


class _GatedEngine:
    """An engine whose first delta waits for `release`: the request is admitted, with no token yet."""

    def __init__(self):
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def stream(self, request):
        self.started.set()
        await self.release.wait()
        yield Delta([5], "a")
        yield Delta([6], "b")


def _span() -> CallSpan:
    return CallSpan("Generate", {}, lambda code: {})


def test_coordinator_counts_waiting_until_the_first_token_and_running_until_the_end():
    metrics = MetricsServer("127.0.0.1", 0)
    try:

        async def scenario():
            engine = _GatedEngine()
            calls = Calls(engine, max_inflight=3)
            seen = []

            async def on_delta(delta, trace_id):
                seen.append(scrape(metrics.address))

            run = asyncio.create_task(calls.run(GenerationRequest(prompt="x"), "Generate", _span(), None, on_delta))
            await engine.started.wait()
            gated = await asyncio.to_thread(scrape, metrics.address)
            engine.release.set()
            await run
            return gated, seen, await asyncio.to_thread(scrape, metrics.address)

        gated, seen, after = asyncio.run(scenario())
    finally:
        metrics.close()
    assert gated[("specdec:requests_waiting", ())] == 1 and gated[("specdec:requests_running", ())] == 1
    assert gated[("specdec:requests_max_inflight", ())] == 3
    # From the first token on the request runs and no longer waits (vLLM's running vs waiting).
    assert [s[("specdec:requests_waiting", ())] for s in seen] == [0, 0]
    assert all(s[("specdec:requests_running", ())] == 1 for s in seen)
    assert after[("specdec:requests_waiting", ())] == 0 and after[("specdec:requests_running", ())] == 0


def test_a_request_that_ends_before_its_first_token_waits_no_more():
    async def scenario():
        engine = _GatedEngine()
        calls = Calls(engine, max_inflight=3)

        async def leave(delta, trace_id):
            raise CallEnded

        run = asyncio.create_task(calls.run(GenerationRequest(prompt="x"), "Generate", _span(), 5.0, leave))
        await engine.started.wait()
        assert _value("specdec:requests_waiting") == 1
        run.cancel()  # the client went away while the prefill waited
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(scenario())
    assert _value("specdec:requests_waiting") == 0 and _value("specdec:requests_running") == 0


class _GatedCore:
    """A draft core whose propose holds the call until `release`, then refuses it (full queue)."""

    def __init__(self):
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def propose(self, call):
        self.entered.set()
        await self.release.wait()
        raise Overloaded("full")


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self):
        self.code = None

    def time_remaining(self):
        return None

    async def abort(self, code, details):
        self.code = code
        raise _Aborted(details)


def test_draft_replica_counts_the_calls_it_is_answering():
    metrics = MetricsServer("127.0.0.1", 0)
    try:

        async def scenario():
            core = _GatedCore()
            servicer, context = DraftServicer(core), _Context()
            request = draft_pb2.ProposeRequest(session_id="s", new_tokens=[1, 2, 3], num_draft_tokens=4)
            call = asyncio.create_task(servicer.Propose(request, context))
            await core.entered.wait()
            during = await asyncio.to_thread(scrape, metrics.address)
            core.release.set()
            with pytest.raises(_Aborted):
                await call
            return during, context.code, await asyncio.to_thread(scrape, metrics.address)

        during, code, after = asyncio.run(scenario())
    finally:
        metrics.close()
    assert during[("specdec:draft_requests_running", ())] == 1
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert after[("specdec:draft_requests_running", ())] == 0
    assert after[("specdec:draft_queue_depth", ())] == 0


def _round(session: str):
    return session, [5, 17, 42, 99, 7, 5, 17, 42], DraftProposal([7, 8]), SamplingParams()


@pytest.fixture
def prefix(ray_local):
    name = f"test-signals-{next(_names)}"
    yield name
    for actor in actor_names(name, "specdec-test"):
        ray.kill(ray.get_actor(actor, namespace="specdec-test"), no_restart=True)


# A small KV pool, so that one session's blocks are a visible share of it.
def _config(tiny_dir) -> ActorConfig:
    return ActorConfig(target_model=tiny_dir("llama", 1), kv_cache_bytes=256 * 1024, metrics_port=0)


def test_target_actor_exports_kv_use_and_its_rounds(tiny_dir, prefix):
    launch(_config(tiny_dir), 1, prefix=prefix, namespace="specdec-test")
    pool = TargetPool(PoolConfig(prefix=prefix, namespace="specdec-test"))
    address = ray.get(pool.actors[f"{prefix}-0"].info.remote())["metrics_address"]
    idle = scrape(address)
    asyncio.run(pool.verify(*_round("s0")))  # the session stays held: its KV blocks are in use
    held = scrape(address)
    asyncio.run(pool.end_session("s0"))
    ended = scrape(address)
    assert idle[("specdec:target_kv_cache_usage_perc", ())] == 0
    used, total = held[("specdec:target_kv_blocks_used", ())], held[("specdec:target_kv_blocks_total", ())]
    assert used > 0 and held[("specdec:target_kv_cache_usage_perc", ())] == pytest.approx(used / total)
    assert held[("specdec:target_rounds_running", ())] == 0 and held[("specdec:target_queue_depth", ())] == 0
    assert ended[("specdec:target_kv_cache_usage_perc", ())] == 0


def test_the_keeper_grows_on_kv_use_and_drains_back_when_it_falls(tiny_dir, prefix):
    """`specdec target --keep --autoscale on` on a real pool: marks low enough that one held
    session is above the high one; the pool grows to its max, then shrinks once the session ends."""
    config = _config(tiny_dir)
    launch(config, 1, prefix=prefix, namespace="specdec-test")
    pool = TargetPool(PoolConfig(prefix=prefix, namespace="specdec-test"))
    total = ray.get(pool.actors[f"{prefix}-0"].load.remote())["kv_blocks_total"]
    scaling = AutoscaleConfig(
        autoscale=True, max_replicas=2, kv_low=0.1 / total, kv_high=0.5 / total, window_s=0.3, cooldown_s=0.0
    )
    stop = threading.Event()
    keeper = threading.Thread(
        target=keep, args=(config, 1, prefix, "specdec-test", 0.1, stop, 30.0, Autoscaler(scaling, 1))
    )
    asyncio.run(pool.verify(*_round("s0")))
    keeper.start()
    try:
        names = [f"{prefix}-0", f"{prefix}-1"]
        deadline = time.monotonic() + 90
        while actor_names(prefix, "specdec-test") != names:
            assert time.monotonic() < deadline, "the keeper did not grow the pool on its KV use"
            time.sleep(0.1)
        # At the max, held KV keeps it there; once the session ends, one actor is drained and removed.
        asyncio.run(pool.end_session("s0"))
        deadline = time.monotonic() + 90
        while actor_names(prefix, "specdec-test") != names[:1]:
            assert time.monotonic() < deadline, "the keeper did not shrink the idle pool"
            time.sleep(0.1)
    finally:
        stop.set()
        keeper.join(60)
    assert not keeper.is_alive()
