"""The draft tier over real gRPC (servers on 127.0.0.1:0 in this process): the engine with the
remote proposer gives exactly the in-process output, lost sessions are recovered by a resend,
concurrent sessions are batched without changing their drafts, and every bad input, overload,
deadline, health and reflection case gets its status."""

from __future__ import annotations

import asyncio
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from specdec.coordinator.clients import DraftClient, pick_replica
from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.core.sampling import SamplingParams
from specdec.draft_service.__main__ import parse_config
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.server import SERVICE_NAME, DraftServer
from specdec.draft_service.service import DeadlineExpired, DraftConfig, DraftCore, ProposeCall
from specdec.local.in_process import LocalModelProposer, LocalNgramProposer, LocalVerifier
from specdec.target_service.verifier import TargetVerifier
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]
NEW_TOKENS = 20
TARGET_SEED, DRAFT_SEED = 1, 2  # as in test_engine: tiny models that neither stall nor never repeat
# Sampling values exact in float32 (the wire type), so both sides warp with the very same numbers.
SAMPLED = SamplingParams(temperature=0.75, top_k=50, top_p=0.875, seed=1234)  # small support: sparse q
SAMPLED_DENSE = SamplingParams(temperature=1.0, seed=99)  # full support: dense q
REPO = Path(__file__).resolve().parents[2]


def run(coro, timeout_s: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


@asynccontextmanager
async def serving(loaded, config: DraftConfig = DraftConfig(), **core_args):
    """A DraftServer on 127.0.0.1:0 and a DraftClient to it."""
    server = DraftServer(DraftCore(loaded, config, **core_args))
    port = await server.start("127.0.0.1", 0)
    client = DraftClient(f"127.0.0.1:{port}")
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop(0)


async def until(condition, timeout_s: float = 10.0) -> None:
    """Wait for a condition the test cannot be notified of (another task's progress), bounded."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


def gate(core: DraftCore) -> tuple[threading.Event, threading.Event]:
    """Make the model step wait for `release`; `entered` is set when a step starts."""
    entered, release = threading.Event(), threading.Event()
    original = core.model.propose_batch

    def gated(items):
        entered.set()
        assert release.wait(30)
        return original(items)

    core.model.propose_batch = gated
    return entered, release


# Pipelining off: these tests count Propose calls and misses per round, which speculative
# next-round calls would blur (pipelining has its own tests in test_pipeline_fallback.py).
CONFIG = EngineConfig(max_draft_tokens=8, pipeline=False, adaptive=False)


def _engine(proposer, target) -> SpeculativeEngine:
    return SpeculativeEngine(proposer, LocalVerifier(TargetVerifier(target)), target, CONFIG)


def _request(
    sampling: SamplingParams = SamplingParams(), prompt=PROMPT, k: int = 4, new_tokens: int = NEW_TOKENS
) -> GenerationRequest:
    return GenerationRequest(
        prompt_token_ids=list(prompt), max_new_tokens=new_tokens, sampling=sampling, max_draft_tokens=k
    )


def _local(tiny, kind: str, drafter: str, request: GenerationRequest):
    target = tiny(kind, TARGET_SEED)
    proposer = LocalNgramProposer() if drafter == "ngram" else LocalModelProposer(ModelDrafter(tiny(kind, DRAFT_SEED)))
    return asyncio.run(_engine(proposer, target).generate(request))


def _request_proto(session_id="s", committed_len=0, new_tokens=PROMPT, k=4, sampling=None, encoding=0, model_k=None):
    return draft_pb2.ProposeRequest(
        session_id=session_id,
        committed_len=committed_len,
        new_tokens=new_tokens,
        num_draft_tokens=k,
        sampling=sampling or common_pb2.SamplingParams(),
        probs_encoding=encoding,
        model_draft_tokens=model_k,
    )


# --- the remote proposer changes nothing --------------------------------------------------------


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SAMPLED, SAMPLED_DENSE], ids=["greedy", "sampled-sparse", "sampled-dense"]
)
@pytest.mark.parametrize("drafter", ["ngram", "model"])
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_remote_proposer_gives_the_in_process_output(tiny, kind, drafter, sampling):
    request = _request(sampling)
    expected = _local(tiny, kind, drafter, request)
    target = tiny(kind, TARGET_SEED)

    async def remote():
        async with serving(None if drafter == "ngram" else tiny(kind, DRAFT_SEED)) as (server, client):
            result = await _engine(client, target).generate(request)
            return result, server.core.stats, len(server.core.store)

    result, stats, sessions_left = run(remote())
    assert result.token_ids == expected.token_ids
    assert result.stats.draft_tokens == expected.stats.draft_tokens and result.stats.draft_tokens > 0
    assert result.stats.accepted_tokens == expected.stats.accepted_tokens
    assert (
        result.stats.rounds - 1 <= stats.calls <= result.stats.rounds and stats.misses == 0
    )  # the last round may have no room for k
    assert sessions_left == 0  # the engine ended its session


def test_fp16_request_is_answered_exactly_and_greedy_carries_no_q(tiny):
    async def check():
        async with serving(tiny("llama", DRAFT_SEED)) as (server, _):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                sampled = common_pb2.SamplingParams(temperature=0.75, seed=5)
                fp16 = await stub.Propose(
                    _request_proto("a", sampling=sampled, encoding=common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP16)
                )
                assert fp16.draft_probs.encoding in (
                    common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP32,
                    common_pb2.DRAFT_PROBS_ENCODING_SPARSE_FP32,
                )
                assert fp16.draft_probs.num_tokens == 4 and fp16.cached_len == len(PROMPT)
                greedy = await stub.Propose(_request_proto("b"))
                assert not greedy.HasField("draft_probs") and len(greedy.token_ids) == 4
                for exact in (common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP32, common_pb2.DRAFT_PROBS_ENCODING_SPARSE_FP32):
                    asked = await stub.Propose(_request_proto("c", sampling=sampled, encoding=exact))
                    assert asked.draft_probs.encoding == exact and asked.token_ids == fp16.token_ids

    run(check())


# --- lost sessions: a miss, a resend, the same output -------------------------------------------


class HookedVerifier:
    """Runs `hook(session_id, tokens)` after round `at` of the generation."""

    def __init__(self, inner, at: int, hook):
        self.inner, self.at, self.hook, self.rounds = inner, at, hook, 0

    async def verify(self, session_id, tokens, proposal, sampling):
        result = await self.inner.verify(session_id, tokens, proposal, sampling)
        self.rounds += 1
        if self.rounds == self.at:
            await self.hook(session_id, tokens)
        return result

    async def end_session(self, session_id):
        await self.inner.end_session(session_id)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("event", ["restart", "evict", "ttl", "truncate"])
@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_lost_session_is_recovered_with_unchanged_output(tiny, drafter, event):
    kind = "gemma3"
    request = _request(SAMPLED if drafter == "model" else SamplingParams())
    expected = _local(tiny, kind, drafter, request)
    target = tiny(kind, TARGET_SEED)
    loaded = None if drafter == "ngram" else tiny(kind, DRAFT_SEED)
    clock = Clock()
    config = DraftConfig(max_sessions=1, session_ttl_s=10.0)

    async def remote():
        server = DraftServer(DraftCore(loaded, config, clock=clock))
        port = await server.start("127.0.0.1", 0)
        client = DraftClient(f"127.0.0.1:{port}")
        servers = [server]

        async def hook(session_id, tokens):
            if event == "restart":  # same address, new process state
                await servers[-1].stop(0)
                servers.append(DraftServer(DraftCore(loaded, config, clock=clock)))
                await servers[-1].start("127.0.0.1", port)
            elif event == "evict":  # max_sessions=1: another session pushes this one out
                await client.propose("intruder", [1, 2, 3], 2, SamplingParams())
            elif event == "ttl":
                clock.now += 11.0
            else:  # the replica holds less than the client builds on
                servers[-1].core.store[session_id].tokens = list(tokens[:3])

        verifier = HookedVerifier(LocalVerifier(TargetVerifier(target)), 2, hook)
        try:
            result = await SpeculativeEngine(client, verifier, target, CONFIG).generate(request)
            return result, client.misses, servers[-1].core.stats.misses
        finally:
            await client.close()
            await servers[-1].stop(0)

    result, client_misses, server_misses = run(remote())
    assert result.token_ids == expected.token_ids
    assert result.stats.accepted_tokens == expected.stats.accepted_tokens
    assert client_misses == 1 and server_misses == 1  # the miss path was taken, once


def test_rolling_back_past_the_sliding_window_drafts_like_a_fresh_session(tiny):
    """Rolling back 30 positions, far past Gemma 3's sliding window of 8, drafts what a fresh
    session drafts (the block pool keeps every position of every layer)."""
    context = [(7 * i) % 250 for i in range(40)]
    other = [200, 201, 202]

    async def check():
        async with serving(tiny("gemma3", DRAFT_SEED)) as (server, _):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                await stub.Propose(_request_proto("s", new_tokens=context))
                rolled = await stub.Propose(_request_proto("s", committed_len=10, new_tokens=other))
                fresh = await stub.Propose(_request_proto("t", new_tokens=context[:10] + other))
                assert rolled.token_ids == fresh.token_ids and rolled.cached_len == 13

    run(check())


# --- concurrency: batched, and each session's output as if alone --------------------------------


def test_32_concurrent_sessions_equal_running_alone_and_are_batched(tiny):
    kind = "llama"
    prompts = [PROMPT[i % 5 :] + [(31 * i) % 250] for i in range(32)]
    samplings = [SamplingParams() if i % 2 == 0 else SamplingParams(temperature=0.75, seed=i) for i in range(32)]
    requests = [
        _request(s, p, new_tokens=10) for p, s in zip(prompts, samplings)
    ]  # 10: the references dominate the time
    alone = [_local(tiny, kind, "model", r).token_ids for r in requests]
    target = tiny(kind, TARGET_SEED)

    async def together():
        async with serving(tiny(kind, DRAFT_SEED), DraftConfig(max_batch=32)) as (server, client):
            engine = _engine(client, target)
            results = await asyncio.gather(*(engine.generate(r) for r in requests))
            return [r.token_ids for r in results], server.core.stats

    outputs, stats = run(together())
    assert outputs == alone
    assert stats.max_batch_size > 1 and stats.batches < stats.batched_calls  # the worker really batched


# --- bad input, overload, deadlines ---------------------------------------------------------------

VOCAB = 259  # the tiny models' vocabulary
BAD_REQUESTS = [
    ({"session_id": ""}, grpc.StatusCode.INVALID_ARGUMENT, "session_id"),
    ({"k": 0}, grpc.StatusCode.INVALID_ARGUMENT, "num_draft_tokens"),
    ({"k": 33}, grpc.StatusCode.INVALID_ARGUMENT, "num_draft_tokens"),
    (
        {"sampling": common_pb2.SamplingParams(temperature=-1.0)},
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.temperature",
    ),
    (
        {"sampling": common_pb2.SamplingParams(temperature=math.nan)},
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.temperature",
    ),
    (
        {"sampling": common_pb2.SamplingParams(temperature=math.inf)},
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.temperature",
    ),
    (
        {"sampling": common_pb2.SamplingParams(temperature=1.0, top_p=1.5)},
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.top_p",
    ),
    (
        {"sampling": common_pb2.SamplingParams(temperature=1.0, top_p=-0.25)},
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.top_p",
    ),
    ({"new_tokens": [5, -1]}, grpc.StatusCode.INVALID_ARGUMENT, "new_tokens"),
    ({"new_tokens": [5, VOCAB]}, grpc.StatusCode.INVALID_ARGUMENT, "new_tokens"),
    ({"new_tokens": []}, grpc.StatusCode.INVALID_ARGUMENT, "new_tokens"),  # empty context
    ({"encoding": 7}, grpc.StatusCode.INVALID_ARGUMENT, "probs_encoding"),
    ({"k": 4, "model_k": 5}, grpc.StatusCode.INVALID_ARGUMENT, "model_draft_tokens"),
    ({"committed_len": 3, "session_id": "never-seen"}, grpc.StatusCode.FAILED_PRECONDITION, "session miss"),
]


def test_bad_requests_get_their_status_naming_the_field(tiny):
    async def check():
        async with serving(tiny("llama", DRAFT_SEED)) as (server, _):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                for fields, code, text in BAD_REQUESTS:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await stub.Propose(_request_proto(**fields))
                    assert (info.value.code(), text in info.value.details()) == (code, True), fields
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.EndSession(draft_pb2.EndSessionRequest(session_id=""))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "session_id" in info.value.details()
                await stub.EndSession(draft_pb2.EndSessionRequest(session_id="unknown"))  # fine
                ok = await stub.Propose(_request_proto(k=32))  # the bounds themselves are accepted
                assert len(ok.token_ids) == 32 and ok.source == draft_pb2.DRAFT_SOURCE_MODEL
                capped = await stub.Propose(
                    _request_proto("capped", k=8, model_k=3)
                )  # the model drafts at most model_draft_tokens
                assert len(capped.token_ids) == 3 and capped.source == draft_pb2.DRAFT_SOURCE_MODEL
                off = await stub.Propose(_request_proto("off", k=8, model_k=0))
                assert list(off.token_ids) == [] and off.source == draft_pb2.DRAFT_SOURCE_MODEL

    run(check())


def test_full_queue_is_resource_exhausted_and_expired_calls_are_never_drafted(tiny):
    async def check():
        async with serving(tiny("llama", DRAFT_SEED), DraftConfig(max_queue=1)) as (server, _):
            core = server.core
            entered, release = gate(core)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                running = asyncio.ensure_future(stub.Propose(_request_proto("a"), timeout=30))
                assert await asyncio.to_thread(entered.wait, 10)  # "a" holds the model
                expiring = asyncio.ensure_future(stub.Propose(_request_proto("b"), timeout=0.5))
                await until(lambda: core.queue_depth == 1)  # "b" waits: the queue is full
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Propose(_request_proto("c"), timeout=30)
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await expiring
                assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                release.set()
                assert len((await running).token_ids) == 4
                await stub.Propose(_request_proto("d"), timeout=30)
                assert core.stats.batched_calls == 2  # a and d; b expired unstarted
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Propose(_request_proto("e"), timeout=1e-4)
                assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert core.stats.batched_calls == 2

    run(check())


def test_a_call_that_arrives_expired_does_no_work():
    core = DraftCore(None)
    call = ProposeCall("s", 0, list(PROMPT), 4, SamplingParams(), timeout_s=0.0)
    with pytest.raises(DeadlineExpired):
        asyncio.run(core.propose(call))
    assert core.stats.calls == 0 and "s" not in core.store


def test_the_draft_models_kv_blocks_return_when_sessions_end_or_are_evicted(tiny):
    """max_sessions 2 over three sessions: the evicted one's blocks come back, ending the others
    returns the rest, and every call drafted."""
    core = DraftCore(tiny("llama", DRAFT_SEED), DraftConfig(max_sessions=2))
    pool = core.model.pool

    async def calls():
        for i, session in enumerate(("a", "b", "c")):
            call = ProposeCall(session, 0, [*PROMPT, i] * 4, 4, SamplingParams())
            assert (await core.propose(call)).proposal.token_ids
        assert "a" not in core.store and pool.used_blocks > 0
        held = sum(len(core.store.peek(s).cache.table.blocks) for s in ("b", "c"))
        assert pool.used_blocks == held  # a's blocks are free again
        core.end_session("b")
        core.end_session("c")
        assert pool.used_blocks == 0
        await core.close()

    asyncio.run(calls())


# --- health, reflection, draining, the process -----------------------------------------------------


async def _health(channel, service: str = "") -> int:
    return (
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    ).status


def test_health_reflection_and_graceful_drain(tiny):
    async def check():
        server = DraftServer()  # no model yet: loading
        port = await server.start("127.0.0.1", 0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            assert await _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Propose(_request_proto(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            await server.set_core(DraftCore(tiny("llama", DRAFT_SEED)))
            for service in ("", SERVICE_NAME):
                assert await _health(channel, service) == health_pb2.HealthCheckResponse.SERVING

            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            names = {s.name async for r in responses for s in r.list_services_response.service}
            assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names

            entered, release = gate(server.core)
            in_flight = asyncio.ensure_future(stub.Propose(_request_proto("a"), timeout=30))
            assert await asyncio.to_thread(entered.wait, 10)
            await server.begin_drain()
            assert await _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Propose(_request_proto("b"), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            stopping = asyncio.ensure_future(server.stop(30))
            release.set()
            assert len((await in_flight).token_ids) == 4  # the call in flight finished
            await stopping

    run(check())


def test_process_serves_and_exits_cleanly_on_sigterm():
    env = dict(os.environ, SPECDEC_DRAFT_PORT="0", SPECDEC_DRAFT_METRICS_PORT="0", SPECDEC_DRAFT_GRACE="5")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdec.draft_service", "--draft-model", "ngram"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert select.select([proc.stdout], [], [], 30)[0], "no output within 30 s"
        line = proc.stdout.readline()  # printed once it listens (the model loads after)
        assert "listening on 127.0.0.1:" in line, line
        address = line.rsplit(" ", 1)[-1].strip()
        metrics_line = proc.stdout.readline()
        assert "metrics on 127.0.0.1:" in metrics_line, metrics_line
        metrics_address = metrics_line.rsplit(" ", 1)[-1].strip()

        async def check():
            async with grpc.aio.insecure_channel(address) as channel:
                await until_serving(channel)
                response = await draft_pb2_grpc.DraftServiceStub(channel).Propose(_request_proto(), timeout=5)
                assert list(response.token_ids) == [42, 120, 33, 64]  # prompt lookup after "5 17"

        run(check(), 30)
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as reply:
            page = reply.read().decode()
        assert 'specdec:draft_propose_calls_total{code="OK"} 1.0' in page
        assert "specdec:draft_tokens_total 4.0" in page and "specdec:draft_sessions 1.0" in page
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def until_serving(channel) -> None:
    async with asyncio.timeout(20):
        while await _health(channel) != health_pb2.HealthCheckResponse.SERVING:
            await asyncio.sleep(0.01)  # the model loads in the background


def test_flags_and_environment_map_onto_the_config():
    config = parse_config(
        ["--max-batch", "8"],
        {"SPECDEC_DRAFT_MAX_BATCH": "4", "SPECDEC_DRAFT_SESSION_TTL": "0", "SPECDEC_DRAFT_PORT": "0"},
    )
    assert config.draft.max_batch == 8  # the flag wins over the environment
    assert config.port == 0 and config.draft.session_ttl_s is None and config.draft_model == "ngram"
    assert parse_config([], {}).port == 50052
    for argv, env in ((["--max-queue", "0"], {}), ([], {"SPECDEC_DRAFT_PORT": "70000"}), (["--grace", "-1"], {})):
        with pytest.raises(SystemExit):
            parse_config(argv, env)


def test_greedy_drafts_stop_before_the_first_token_the_draft_is_unsure_of(tiny):
    import dataclasses

    import torch
    from reference import target_only

    target, draft = tiny("llama", TARGET_SEED), tiny("llama", DRAFT_SEED)
    full = ModelDrafter(draft).propose("a", PROMPT, 8, SamplingParams()).token_ids
    assert len(full) == 8  # off unless asked for: a plain model has no threshold of its own
    confidences, tokens = [], list(PROMPT)
    for token in full:  # the draft's own probability of each of its greedy tokens
        logits = draft.model(input_ids=torch.tensor([tokens])).logits[0, -1]  # (vocab,)
        confidences.append(float(torch.softmax(logits.float(), -1)[token]))
        tokens.append(token)
    cuts = set()
    for threshold in sorted({min(c + 1e-4, 0.999) for c in confidences} | {0.5}):
        cut = next((j for j, c in enumerate(confidences) if c < threshold), len(full))
        assert (
            ModelDrafter(draft, min_confidence=threshold).propose("a", PROMPT, 8, SamplingParams()).token_ids
            == full[:cut]
        )
        cuts.add(cut)
    assert len(cuts) > 1  # the thresholds tried did cut at different depths
    # A draft that carries its own threshold (a distilled draft's draft.json) uses it by default.
    assert (
        ModelDrafter(dataclasses.replace(draft, min_confidence=0.999))
        .propose("c", PROMPT, 8, SamplingParams())
        .token_ids
        == full[: min(cuts)]
    )
    sampled = SamplingParams(temperature=0.8, seed=3)  # sampled drafts keep k: their output depends on the cut
    assert len(ModelDrafter(draft, min_confidence=0.999).propose("b", PROMPT, 8, sampled).token_ids) == 8
    with pytest.raises(ValueError):
        ModelDrafter(draft, min_confidence=1.0)
    # Through the engine, greedy output is the target's own at any threshold.
    expected = target_only(target.model, PROMPT, NEW_TOKENS, target.eos_token_ids)
    for threshold in (0.3, 0.9):
        engine = SpeculativeEngine(
            LocalModelProposer(ModelDrafter(draft, min_confidence=threshold)),
            LocalVerifier(TargetVerifier(target)),
            target,
            EngineConfig(adaptive=False),
        )
        result = asyncio.run(
            engine.generate(GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, max_draft_tokens=6))
        )
        assert result.token_ids == expected
    assert parse_config(["--min-confidence", "0.4"], {}).draft.min_confidence == 0.4
    assert parse_config([], {}).draft.min_confidence is None  # auto: the draft's own
    with pytest.raises(SystemExit):
        parse_config(["--min-confidence", "1"], {})


# --- replica affinity -----------------------------------------------------------------------------


def test_rendezvous_hashing_is_stable_spreads_and_moves_only_the_removed_replicas_sessions():
    replicas = [f"10.0.0.{i}:50052" for i in range(4)]
    sessions = [f"session-{i}" for i in range(400)]
    placed = {s: pick_replica(s, replicas) for s in sessions}
    counts = [list(placed.values()).count(r) for r in replicas]
    assert min(counts) > 60  # 100 each on average
    assert all(pick_replica(s, list(reversed(replicas))) == placed[s] for s in sessions)  # order-free
    moved = [s for s in sessions if pick_replica(s, replicas[:3]) != placed[s]]
    assert moved and all(placed[s] == replicas[3] for s in moved)


def test_dns_target_resolves_to_every_replica_and_keeps_sessions_on_one(tiny, monkeypatch):
    async def check():
        first = DraftServer(DraftCore(None))
        port = await first.start("127.0.0.1", 0)
        second = DraftServer(DraftCore(None))
        await second.start("127.0.0.2", port)  # all of 127/8 is loopback: two "pods", one port
        real = socket.getaddrinfo

        def fake(host, *args, **kwargs):  # the resolver of a headless service with two pods
            if host == "drafts.test":
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ("127.0.0.1", "127.0.0.2")]
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", fake)
        client = DraftClient(f"dns:///drafts.test:{port}")
        try:
            for round_ in range(3):
                for i in range(12):
                    tokens = PROMPT + list(range(round_ + 1))
                    await client.propose(f"s{i}", tokens, 3, SamplingParams())
            held = [set(server.core.store) for server in (first, second)]
            assert held[0] and held[1] and not held[0] & held[1]  # spread, and each session on one replica
            assert held[0] | held[1] == {f"s{i}" for i in range(12)}
            assert client.misses == 0 and first.core.stats.calls + second.core.stats.calls == 36
        finally:
            await client.close()
            await first.stop(0)
            await second.stop(0)

    run(check())
