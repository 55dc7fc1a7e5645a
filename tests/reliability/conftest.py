"""Fixtures shared by the reliability tests (add fixtures here; change none that others use).

`served`: the public API over real tiers on 127.0.0.1 ports the OS picks: an n-gram DraftServer
that requires a token (its DraftClient sends it), one tiny-llama target actor on the session's
local Ray, and a GenerationServer. The servers live on an event loop in a thread of their own;
tests call them with plain blocking grpc.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import grpc
import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from loop_thread import LoopThread
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from specdec.coordinator.clients import DraftClient, DraftClientConfig
from specdec.coordinator.engine import EngineConfig, SpeculativeEngine
from specdec.coordinator.remote import connect_engine
from specdec.coordinator.server import GenerationServer, ServerConfig
from specdec.draft_service.server import DraftServer
from specdec.draft_service.service import DraftCore
from specdec.target_service.pool import PoolConfig, TargetPool
from specdec.v1 import generation_pb2 as pb
from specdec.v1 import generation_pb2_grpc

NAMESPACE = "specdec-test"  # the ray_local fixture's
TARGET_SEED = 1  # tests/engine/test_engine.py's target: neither stalls nor never repeats
MAX_DRAFT = 8  # the served engine's max_draft_tokens
PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]  # repeats: the n-gram drafter drafts


@dataclass
class Served:
    loop: LoopThread
    draft: DraftServer
    draft_address: str
    draft_token: str  # what the draft server requires
    client: DraftClient
    pool: TargetPool
    engine: SpeculativeEngine
    server: GenerationServer
    address: str  # the coordinator's 127.0.0.1:port
    spans: InMemorySpanExporter  # the coordinator's server and round spans
    channel: grpc.Channel = field(init=False)
    stub: generation_pb2_grpc.GenerationServiceStub = field(init=False)

    def __post_init__(self):
        self.channel = grpc.insecure_channel(self.address)
        self.stub = generation_pb2_grpc.GenerationServiceStub(self.channel)

    def good_request(self, **fields) -> pb.GenerateRequest:
        return pb.GenerateRequest(**{"prompt_token_ids": PROMPT, "max_new_tokens": 6, **fields})

    def assert_healthy(self) -> None:
        """Health says SERVING and a good request is answered in full."""
        health = health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        response = self.stub.Generate(self.good_request(), timeout=30)
        assert len(response.token_ids) == 6 and response.finish_reason == pb.FINISH_REASON_LENGTH

    def sessions(self) -> tuple[int, int]:
        """Sessions held by the draft server and by the target actor."""
        actor = next(iter(self.pool.actors.values()))
        return len(self.draft.core.store), ray.get(actor.info.remote())["sessions"]


@pytest.fixture(scope="session")
def served(ray_local, tiny_dir):
    loop = LoopThread()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("reliability")  # the test's own provider: no global state
    prefix = "reliability-served"
    from stackkit import launch_pool

    launch_pool(prefix, tiny_dir("llama", TARGET_SEED))  # no CPU reserved: it lives for the session
    pool = TargetPool(PoolConfig(prefix=prefix, namespace=NAMESPACE))
    token = secrets.token_hex(16)

    async def start():
        draft = DraftServer(DraftCore(None), auth_token=token)
        draft_port = await draft.start("127.0.0.1", 0)
        client = DraftClient(f"127.0.0.1:{draft_port}", DraftClientConfig(auth_token=token))
        engine = await connect_engine(client, pool, None, EngineConfig(max_draft_tokens=MAX_DRAFT), tracer)
        server = GenerationServer(engine, ServerConfig(port=0, max_inflight=16), tracer=tracer)
        port = await server.start()
        return Served(
            loop, draft, f"127.0.0.1:{draft_port}", token, client, pool, engine, server, f"127.0.0.1:{port}", spans
        )

    s = loop.run(start())
    yield s
    s.channel.close()

    async def stop():
        await s.server.stop(0)
        await s.client.close()
        await s.draft.stop(0)

    loop.run(stop())
    loop.close()
    for actor in pool.actors.values():
        ray.kill(actor, no_restart=True)


# --- test_faults.py, test_slow.py, test_load.py ----------------------------------------------------------


@pytest.fixture(scope="session")
def fault_tiers(ray_local, tiny_dir):
    """A draft server process (n-gram) and one target actor for the whole session; the fault
    tests kill and restart them, the load test presses the actor's bound of 12 sessions."""
    from stackkit import POOL, TTL_S, Tiers

    tiers = Tiers(tiny_dir("llama", TARGET_SEED), POOL, TTL_S, max_sessions=12, max_cached_tokens=2400)
    yield tiers
    tiers.close()


@pytest.fixture(scope="session")
def fault_expected(fault_tiers, tiny):
    """stackkit.REQUESTS through the unfaulted stack, each checked against the single-process engine."""
    from stackkit import REQUESTS, Stack, expected_outcomes

    stack = Stack(fault_tiers)
    try:
        return expected_outcomes(stack, REQUESTS, tiny("llama", TARGET_SEED))
    finally:
        stack.close()
