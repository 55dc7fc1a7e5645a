"""The public API end to end: real gRPC on 127.0.0.1:0, a real draft server, the target pool on the
local Ray, tiny models. Speculation changes nothing a client sees; every bad request, the
deadline, cancellation and overload get their status and leave no session behind on either tier."""

from __future__ import annotations

import asyncio
import json
import math
from contextlib import contextmanager

import grpc
import httpx2 as httpx
import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from loop_thread import LoopThread
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from reference import target_only
from serving_kit import GatedEngine, serving, until

from specdec.cli.app import main
from specdec.coordinator.clients import DraftClient
from specdec.coordinator.convert import request_from_proto
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.remote import connect_engine
from specdec.coordinator.server import SERVICE_NAME, GenerationServer, ServerConfig
from specdec.draft_service.server import DraftServer
from specdec.draft_service.service import DraftCore
from specdec.local.in_process import build_engine
from specdec.target_service.actor import ActorConfig
from specdec.target_service.pool import PoolConfig, TargetOverloaded, TargetPool, TargetUnavailable, launch
from specdec.v1 import common_pb2, generation_pb2_grpc
from specdec.v1 import generation_pb2 as pb

NAMESPACE, POOL = "specdec-test", "test-coordinator"
TARGET_SEED, DRAFT_SEED = 1, 2  # as in test_engine: tiny models that neither stall nor never repeat
PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]
MAX_DRAFT = 8
SEEDED = common_pb2.SamplingParams(temperature=0.75, top_k=50, top_p=0.875, seed=1234)  # exact in float32


class Stack:
    """Draft servers (n-gram and a tiny draft model), one target actor, and a coordinator per drafter."""

    def __init__(self, tiny, tiny_dir):
        self.loop = LoopThread()
        self.spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = provider.get_tracer("test")  # a provider of the test's own: no global state
        launch(ActorConfig(target_model=tiny_dir("llama", TARGET_SEED)), 1, prefix=POOL, namespace=NAMESPACE)
        self.pool = TargetPool(PoolConfig(prefix=POOL, namespace=NAMESPACE))
        self.actor = next(iter(self.pool.actors.values()))
        self.drafts: dict[str, DraftServer] = {}
        self.clients: list[DraftClient] = []
        self.servers: dict[str, GenerationServer] = {}
        self.addresses: dict[str, str] = {}
        for drafter, loaded in (("ngram", None), ("model", tiny("llama", DRAFT_SEED))):
            self.loop.run(self._start(drafter, loaded))
        self.address = self.addresses["ngram"]
        self.channel = grpc.insecure_channel(self.address)
        self.stub = generation_pb2_grpc.GenerationServiceStub(self.channel)

    async def _start(self, drafter: str, loaded) -> None:
        draft = DraftServer(DraftCore(loaded))
        port = await draft.start("127.0.0.1", 0)
        client = DraftClient(f"127.0.0.1:{port}")
        # target_model None: the tokenizer comes from the model the pool reports.
        engine = await connect_engine(
            client, self.pool, None, EngineConfig(max_draft_tokens=MAX_DRAFT, adaptive=False), self.tracer
        )
        server = GenerationServer(engine, ServerConfig(port=0, max_inflight=8), tracer=self.tracer)
        self.drafts[drafter], self.servers[drafter] = draft, server
        self.clients.append(client)
        self.addresses[drafter] = f"127.0.0.1:{await server.start()}"

    def sessions(self) -> tuple[int, int]:
        """Sessions held by the draft tier (both servers) and by the target actor."""
        return sum(len(d.core.store) for d in self.drafts.values()), ray.get(self.actor.info.remote())["sessions"]

    def close(self) -> None:
        self.channel.close()

        async def stop():
            for server in self.servers.values():
                await server.stop(0)
            for client in self.clients:
                await client.close()
            for draft in self.drafts.values():
                await draft.stop(0)

        self.loop.run(stop())
        self.loop.close()
        ray.kill(self.actor, no_restart=True)


@pytest.fixture(scope="module")
def stack(ray_local, tiny, tiny_dir):
    s = Stack(tiny, tiny_dir)
    yield s
    s.close()


def _request(**fields) -> pb.GenerateRequest:
    fields.setdefault("max_new_tokens", 24)
    if "prompt" not in fields:
        fields.setdefault("prompt_token_ids", PROMPT)
    return pb.GenerateRequest(**fields)


def _stream_request(request: pb.GenerateRequest) -> pb.GenerateStreamRequest:
    return pb.GenerateStreamRequest.FromString(request.SerializeToString())


# --- speculation changes nothing a client sees --------------------------------------------------------


def test_greedy_generate_equals_target_only_and_carries_its_trace(stack, tiny):
    target = tiny("llama", TARGET_SEED)
    stack.spans.clear()
    response = stack.stub.Generate(_request(), timeout=60)
    assert list(response.token_ids) == target_only(target.model, PROMPT, 24, target.eos_token_ids)
    assert response.text == target.tokenizer.decode(response.token_ids, skip_special_tokens=True)
    assert response.usage.prompt_tokens == len(PROMPT) and response.usage.completion_tokens == len(response.token_ids)
    assert response.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    assert response.speculation.rounds > 0 and response.speculation.draft_tokens > 0
    [span] = [s for s in stack.spans.get_finished_spans() if s.name == f"{SERVICE_NAME}/Generate"]
    assert response.trace_id == f"{span.context.trace_id:032x}"
    assert stack.sessions() == (0, 0)  # a finished request ends its sessions on both tiers


def test_stream_concatenates_to_generate(stack):
    request = _request(prompt="abc abc abc", max_new_tokens=30)
    whole = stack.stub.Generate(request, timeout=60)
    messages = list(stack.stub.GenerateStream(_stream_request(request), timeout=60))
    assert len(messages) > 1  # a message per round
    assert "".join(m.text for m in messages) == whole.text
    assert [t for m in messages for t in m.token_ids] == list(whole.token_ids)
    last = messages[-1]
    assert all(m.finish_reason == pb.FINISH_REASON_UNSPECIFIED and not m.HasField("usage") for m in messages[:-1])
    assert last.finish_reason == whole.finish_reason and last.usage == whole.usage
    assert last.speculation.rounds == whole.speculation.rounds == len(messages)
    assert len({m.trace_id for m in messages}) == 1 and len(last.trace_id) == 32 and last.trace_id != whole.trace_id


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_seeded_sampling_equals_the_in_process_engine(stack, tiny, drafter):
    request = _request(sampling=SEEDED, max_new_tokens=30, speculation=pb.SpeculationParams(max_draft_tokens=3))
    draft = tiny("llama", DRAFT_SEED) if drafter == "model" else None
    expected = asyncio.run(
        build_engine(
            tiny("llama", TARGET_SEED), draft, EngineConfig(max_draft_tokens=MAX_DRAFT, adaptive=False)
        ).generate(request_from_proto(request))
    )
    with grpc.insecure_channel(stack.addresses[drafter]) as channel:
        response = generation_pb2_grpc.GenerationServiceStub(channel).Generate(request, timeout=60)
    assert list(response.token_ids) == expected.token_ids and response.text == expected.text
    assert response.speculation.draft_tokens > 0


# --- every bad request gets its status ------------------------------------------------------------------


BAD = [
    (dict(prompt_token_ids=[]), "prompt"),  # empty prompt
    (dict(prompt_token_ids=[5] * 256), "prompt"),  # the tiny models' context is 256
    (dict(prompt="abc", prompt_token_ids=[5]), "prompt"),
    (dict(prompt_token_ids=[5, 100_000]), "prompt_token_ids"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=256), "max_new_tokens"),  # more than the context leaves
    (dict(sampling=common_pb2.SamplingParams(temperature=-0.5)), "sampling.temperature"),
    (dict(sampling=common_pb2.SamplingParams(temperature=math.nan)), "sampling.temperature"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1.0, top_p=1.5)), "sampling.top_p"),
    (dict(speculation=pb.SpeculationParams(max_draft_tokens=MAX_DRAFT + 1)), "speculation.max_draft_tokens"),
]


@pytest.mark.parametrize("fields, field", BAD, ids=[f"{field}-{i}" for i, (_, field) in enumerate(BAD)])
def test_bad_request_is_invalid_argument_naming_the_field(stack, fields, field):
    request = _request(**fields)
    with pytest.raises(grpc.RpcError) as unary:
        stack.stub.Generate(request, timeout=30)
    with pytest.raises(grpc.RpcError) as streamed:
        list(stack.stub.GenerateStream(_stream_request(request), timeout=30))
    for error in (unary.value, streamed.value):
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith(f"{field}: "), error.details()


# --- deadline, cancellation, overload --------------------------------------------------------------------


@contextmanager
def stalled_after(stack, rounds: int):
    """The target tier answers `rounds` rounds, then the next one never returns (until released)."""
    engine = stack.servers["ngram"].servicer.engine
    pool, release, calls = engine.verifier, asyncio.Event(), []

    class Stalling:
        async def verify(self, *args):
            calls.append(args[0])
            if len(calls) > rounds:
                await release.wait()
            return await pool.verify(*args)

        async def end_session(self, session_id, completion=()):
            await pool.end_session(session_id)

    engine.verifier = Stalling()
    try:
        yield calls
    finally:
        engine.verifier = pool
        stack.loop.loop.call_soon_threadsafe(release.set)


def test_deadline_mid_generation_is_deadline_exceeded_and_frees_both_tiers(stack):
    with stalled_after(stack, rounds=3) as calls:
        with pytest.raises(grpc.RpcError) as info:
            stack.stub.Generate(_request(max_new_tokens=200), timeout=1.0)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert len(calls) == 4  # three rounds ran, the fourth was waiting when the deadline passed
        until(lambda: stack.servers["ngram"].stats.in_flight == 0)
    assert stack.sessions() == (0, 0)


def test_cancelled_stream_frees_both_tiers(stack):
    stats = stack.servers["ngram"].stats
    failed = stats.failed
    call = stack.stub.GenerateStream(_stream_request(_request(max_new_tokens=200)), timeout=60)
    first = next(call)
    assert first.token_ids and first.finish_reason == pb.FINISH_REASON_UNSPECIFIED
    call.cancel()
    until(lambda: stats.in_flight == 0)
    assert stats.failed == failed + 1  # the engine was cancelled, not run to the end
    assert stack.sessions() == (0, 0)


def test_beyond_max_inflight_is_resource_exhausted():
    engine = GatedEngine()
    with serving(engine, max_inflight=2) as (loop, server):
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            first, second = (stub.Generate.future(_request(), timeout=30) for _ in range(2))
            until(lambda: engine.entered == 2)
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(_request(), timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_inflight 2" in info.value.details()
            loop.loop.call_soon_threadsafe(engine.release.set)
            assert first.result().token_ids == [7] and second.result().text == "x"
            assert stub.Generate(_request(), timeout=30).token_ids == [7]  # room again


def test_a_full_target_tier_is_resource_exhausted_not_internal():
    """Every actor's queue full: the pool raises TargetOverloaded, and the caller is told to back
    off (RESOURCE_EXHAUSTED), as with the coordinator's own max_inflight."""

    class FullTier:
        target = GatedEngine().target

        async def stream(self, request):
            raise TargetOverloaded("all 2 target actors have full queues")
            yield  # an async generator, as the engine's stream is

    with serving(FullTier()) as (_, server):
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(_request(), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "full queues" in info.value.details()


def test_a_target_tier_gone_is_not_serving_and_unavailable_until_it_returns():
    """Health follows the target tier (`GenerationServer.follow`, fed by the pool's `reachable`):
    NOT_SERVING while no actor answers, SERVING again when one does; calls meanwhile are
    UNAVAILABLE (TargetUnavailable), never INTERNAL."""
    tier = {"up": True}

    class GoneTier:
        target = GatedEngine().target

        async def stream(self, request):
            raise TargetUnavailable("no target actors named specdec-target-N in specdec")
            yield  # an async generator, as the engine's stream is

    async def reachable() -> bool:
        return tier["up"]

    with serving(GoneTier(), http_port=0) as (loop, server):
        http_health = f"http://127.0.0.1:{server.http_port}/health"
        following = asyncio.run_coroutine_threadsafe(server.follow(reachable, 0.02), loop.loop)
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def status():
                return health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10).status

            assert status() == health_pb2.HealthCheckResponse.SERVING
            tier["up"] = False
            until(lambda: status() == health_pb2.HealthCheckResponse.NOT_SERVING)
            assert httpx.get(http_health, timeout=10).status_code == 503
            with pytest.raises(grpc.RpcError) as info:
                generation_pb2_grpc.GenerationServiceStub(channel).Generate(_request(), timeout=30)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "no target actors" in info.value.details()
            tier["up"] = True
            until(lambda: status() == health_pb2.HealthCheckResponse.SERVING)
            assert httpx.get(http_health, timeout=10).status_code == 200
        following.cancel()


# --- health, reflection, the CLI ----------------------------------------------------------------------------


def test_health_and_reflection_answer(stack):
    health = health_pb2_grpc.HealthStub(stack.channel)
    for service in ("", SERVICE_NAME):
        assert (
            health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
            == health_pb2.HealthCheckResponse.SERVING
        )
    reflection = reflection_pb2_grpc.ServerReflectionStub(stack.channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
    ]
    listed, described = list(reflection.ServerReflectionInfo(iter(requests), timeout=10))
    assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= {
        s.name for s in listed.list_services_response.service
    }
    assert described.file_descriptor_response.file_descriptor_proto  # what grpcurl needs to describe and call


def test_cli_generate_calls_the_coordinator(stack, tiny, capsys):
    target = tiny("llama", TARGET_SEED)
    prompt = target.tokenizer("abc abc")["input_ids"]
    assert main(["generate", "--address", stack.address, "--max-new-tokens", "12", "--json", "abc abc"]) == 0
    response = json.loads(capsys.readouterr().out)
    assert [int(t) for t in response["tokenIds"]] == target_only(target.model, prompt, 12, target.eos_token_ids)
    assert len(response["traceId"]) == 32 and int(response["usage"]["promptTokens"]) == len(prompt)

    assert main(["generate", "--address", stack.address, "--max-new-tokens", "12", "--stream", "abc abc"]) == 0
    out, err = capsys.readouterr()
    assert out == response.get("text", "") + "\n"
    assert "tokens/s" in err and "acceptance" in err and f"trace {'0' * 32}" not in err and "trace " in err

    assert main(["generate", "--address", stack.address, "--temperature", "-1", "abc"]) == 2
    assert "invalid argument: sampling.temperature" in capsys.readouterr().err


def test_cli_without_a_coordinator_says_how_to_start_one(capsys):
    import socket

    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        assert main(["generate", "--address", address, "--timeout", "10", "hello"]) == 1
    assert "specdec up" in capsys.readouterr().err


def test_an_auto_token_budget_leaves_drafts_to_the_pass_cost(stack):
    from specdec.core.settings import AUTO

    async def budget(configured: int) -> int:
        engine = await connect_engine(
            stack.clients[0], stack.pool, None, EngineConfig(speculation_token_budget=configured)
        )
        return engine.config.speculation_token_budget

    assert stack.loop.run(budget(AUTO)) == 0  # no cap: the policy prices drafts by the pass they make
    assert stack.loop.run(budget(40)) == 40  # a set value stays


def test_the_engine_starts_from_the_passes_the_target_timed(stack):
    """The actor times decode-shaped passes before serving; the coordinator's cost model starts
    from them, so the first rounds are priced by the device, not by a guessed slope."""
    timed = ray.get(stack.actor.info.remote())["pass_seconds"]
    assert timed and all(seconds > 0 for seconds in timed.values()) and 1 in timed

    async def engine():
        return await connect_engine(stack.clients[0], stack.pool, None, EngineConfig())

    costs = stack.loop.run(engine()).costs
    # One row, no trip yet; a pass never priced above a longer one that timed cheaper.
    assert all(costs.verify(n) == pytest.approx(min(s for m, s in timed.items() if m >= n)) for n in timed)
    # The actor runs plain rounds ahead: the engine prices a round without drafts as its pass and trip overlapped.
    assert ray.get(stack.actor.info.remote())["lookahead"] is True and costs.plain_ahead
