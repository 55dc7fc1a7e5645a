"""The draft tier over real gRPC (servers on 127.0.0.1:0 in this process): the engine with the
remote proposer gives exactly the in-process output, lost sessions are recovered by a resend,
concurrent sessions are batched without changing their drafts, and every bad input, overload,
deadline, health and reflection case gets its status."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import grpc
import pytest
from draft_kit import (
    DRAFT_SEED,
    NEW_TOKENS,
    PROMPT,
    SAMPLED,
    SAMPLED_DENSE,
    TARGET_SEED,
    gate,
    propose_request,
    run,
    serving,
    until,
)

from specdec.coordinator.clients import DraftClient
from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.core.sampling import SamplingParams
from specdec.draft_service.__main__ import parse_config
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.registry import ModelDrafting, NgramDrafting
from specdec.draft_service.server import DraftServer
from specdec.draft_service.service import DeadlineExpired, DraftConfig, DraftCore, ProposeCall
from specdec.draft_service.suffix import SuffixConfig
from specdec.local.in_process import LocalProposer, LocalVerifier
from specdec.target_service.verifier import TargetVerifier
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

# Pipelining off: these tests count Propose calls and misses per round, which speculative
# next-round calls would blur (pipelining has its own tests in test_pipeline_fallback.py).
CONFIG = EngineConfig(max_draft_tokens=8, pipeline=False, adaptive=False)


def _engine(proposer, target, **config) -> SpeculativeEngine:
    return SpeculativeEngine(proposer, LocalVerifier(TargetVerifier(target)), target, replace(CONFIG, **config))


def _request(
    sampling: SamplingParams = SamplingParams(), prompt=PROMPT, k: int = 4, new_tokens: int = NEW_TOKENS
) -> GenerationRequest:
    return GenerationRequest(
        prompt_token_ids=list(prompt), max_new_tokens=new_tokens, sampling=sampling, max_draft_tokens=k
    )


def _local(tiny, kind: str, drafter: str, request: GenerationRequest):
    target = tiny(kind, TARGET_SEED)
    proposer = (
        LocalProposer(NgramDrafting())
        if drafter == "ngram"
        else LocalProposer(ModelDrafting(ModelDrafter(tiny(kind, DRAFT_SEED))))
    )
    return asyncio.run(_engine(proposer, target).generate(request))


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


def test_a_suffix_replica_learns_completions_from_end_session_and_drafts_them_for_later_requests(tiny):
    target = tiny("llama", TARGET_SEED)
    similar = [[40 + i, *PROMPT] for i in range(3)]  # one template, a different first token each

    async def check():
        async with serving(None, suffix=SuffixConfig()) as (server, client):
            engine = _engine(client, target)
            results = [await engine.generate(_request(prompt=prompt)) for prompt in similar]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.EndSession(draft_pb2.EndSessionRequest(session_id="x", completion_token_ids=[3, -1]))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "completion_token_ids" in info.value.details()
            return results, server.core

    results, core = run(check())
    for prompt, result in zip(similar, results):
        assert result.token_ids == _local_tokens(tiny, prompt)
    assert core.drafter.suffix.stats.learned == len(similar) and core.drafter.suffix.stats.from_cache > 0
    assert len(core.store) == 0


def test_requests_that_never_drafted_still_teach_the_suffix_replica(tiny):
    """Speculation off sends no Propose, so no replica holds the session; its completion still
    goes to the replica its drafts would have used, where a later request drafts from it."""
    target = tiny("llama", TARGET_SEED)

    async def check():
        async with serving(None, suffix=SuffixConfig()) as (server, client):
            engine = _engine(client, target)
            off = replace(_request(), speculate=False)
            plain = await engine.generate(off)
            learned = server.core.drafter.suffix.stats.learned
            again = await engine.generate(_request())
            return plain, learned, again, server.core

    plain, learned, again, core = run(check())
    assert plain.stats.draft_tokens == 0 and learned == 1  # taught without a single Propose
    assert again.token_ids == plain.token_ids and again.stats.accepted_tokens > 0
    assert core.drafter.suffix.stats.from_cache > 0  # the second request drafted from the first's completion


def test_a_suffix_replica_answers_a_tree_over_grpc_and_the_engine_verifies_it(tiny):
    """Over a real gRPC server: a Propose with `tree` set gets a tree (parent_indices, one per
    token, parents first) where completions branch, without it a chain; an engine with token trees
    on serves similar requests through that replica with the outputs of lookup decoding."""
    target = tiny("llama", TARGET_SEED)
    similar = [[40 + i, *PROMPT] for i in range(4)]

    async def check():
        async with serving(None, suffix=SuffixConfig()) as (server, client):
            for i, tail in enumerate(([7, 8], [7, 8], [9, 10])):
                server.core.end_session(f"done-{i}", [*PROMPT[-3:], *tail])
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                asked = propose_request("t", new_tokens=[1, *PROMPT[-3:]], k=6)
                asked.tree = True
                branched = await stub.Propose(asked)
                chain = await stub.Propose(propose_request("c", new_tokens=[1, *PROMPT[-3:]], k=6))
            engine = _engine(client, target, token_tree=True)
            results = [await engine.generate(_request(prompt=prompt)) for prompt in similar]
            return branched, chain, results

    branched, chain, results = run(check())
    assert sorted(branched.token_ids) == [7, 8, 9, 10] and list(branched.parent_indices) == [-1, 0, -1, 2]
    assert list(chain.token_ids) == [7, 8] and not chain.parent_indices
    for prompt, result in zip(similar, results):
        assert result.token_ids == _local_tokens(tiny, prompt)


def _local_tokens(tiny, prompt) -> list[int]:
    return _local(tiny, "llama", "ngram", _request(prompt=prompt)).token_ids


def test_fp16_request_is_answered_exactly_and_greedy_carries_no_q(tiny):
    async def check():
        async with serving(tiny("llama", DRAFT_SEED)) as (server, _):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                sampled = common_pb2.SamplingParams(temperature=0.75, seed=5)
                fp16 = await stub.Propose(
                    propose_request("a", sampling=sampled, encoding=common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP16)
                )
                assert fp16.draft_probs.encoding in (
                    common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP32,
                    common_pb2.DRAFT_PROBS_ENCODING_SPARSE_FP32,
                )
                assert fp16.draft_probs.num_tokens == 4 and fp16.cached_len == len(PROMPT)
                greedy = await stub.Propose(propose_request("b"))
                assert not greedy.HasField("draft_probs") and len(greedy.token_ids) == 4
                for exact in (common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP32, common_pb2.DRAFT_PROBS_ENCODING_SPARSE_FP32):
                    asked = await stub.Propose(propose_request("c", sampling=sampled, encoding=exact))
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

    async def end_session(self, session_id, completion=()):
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
                await stub.Propose(propose_request("s", new_tokens=context))
                rolled = await stub.Propose(propose_request("s", committed_len=10, new_tokens=other))
                fresh = await stub.Propose(propose_request("t", new_tokens=context[:10] + other))
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
                        await stub.Propose(propose_request(**fields))
                    assert (info.value.code(), text in info.value.details()) == (code, True), fields
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.EndSession(draft_pb2.EndSessionRequest(session_id=""))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "session_id" in info.value.details()
                await stub.EndSession(draft_pb2.EndSessionRequest(session_id="unknown"))  # fine
                ok = await stub.Propose(propose_request(k=32))  # the bounds themselves are accepted
                assert len(ok.token_ids) == 32 and ok.source == draft_pb2.DRAFT_SOURCE_MODEL
                capped = await stub.Propose(
                    propose_request("capped", k=8, model_k=3)
                )  # the model drafts at most model_draft_tokens
                assert len(capped.token_ids) == 3 and capped.source == draft_pb2.DRAFT_SOURCE_MODEL
                off = await stub.Propose(propose_request("off", k=8, model_k=0))
                assert list(off.token_ids) == [] and off.source == draft_pb2.DRAFT_SOURCE_MODEL

    run(check())


def test_full_queue_is_resource_exhausted_and_expired_calls_are_never_drafted(tiny):
    async def check():
        async with serving(tiny("llama", DRAFT_SEED), DraftConfig(max_queue=1)) as (server, _):
            core = server.core
            entered, release = gate(core)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                running = asyncio.ensure_future(stub.Propose(propose_request("a"), timeout=30))
                assert await asyncio.to_thread(entered.wait, 10)  # "a" holds the model
                expiring = asyncio.ensure_future(stub.Propose(propose_request("b"), timeout=0.5))
                await until(lambda: core.queue_depth == 1)  # "b" waits: the queue is full
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Propose(propose_request("c"), timeout=30)
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await expiring
                assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                release.set()
                assert len((await running).token_ids) == 4
                await stub.Propose(propose_request("d"), timeout=30)
                assert core.stats.batched_calls == 2  # a and d; b expired unstarted
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Propose(propose_request("e"), timeout=1e-4)
                assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert core.stats.batched_calls == 2

    run(check())


def test_a_call_that_arrives_expired_does_no_work():
    core = DraftCore(None)
    call = ProposeCall("s", 0, list(PROMPT), 4, SamplingParams(), timeout_s=0.0)
    with pytest.raises(DeadlineExpired):
        asyncio.run(core.propose(call))
    assert core.stats.calls == 0 and "s" not in core.store


def test_a_propose_that_arrives_after_its_end_session_holds_nothing():
    """A caller cancelled mid-Propose ends the session at once; the cancelled Propose may still
    reach the replica after the EndSession. It is refused, and the session is not held for its
    TTL. The ended id is forgotten after the TTL."""
    clock = Clock()

    async def check():
        server = DraftServer(DraftCore(None, DraftConfig(session_ttl_s=60), clock=clock))
        port = await server.start("127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                await stub.EndSession(draft_pb2.EndSessionRequest(session_id="late"))
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Propose(propose_request("late"), timeout=5)
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "ended" in info.value.details()
                assert "late" not in server.core.store
                assert (await stub.Propose(propose_request("other"), timeout=5)).token_ids
                clock.now += 61
                await stub.EndSession(draft_pb2.EndSessionRequest(session_id="other"))  # prunes what the TTL passed
                await stub.Propose(propose_request("late"), timeout=5)
                assert "late" in server.core.store
        finally:
            await server.stop(0)

    run(check())


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
            LocalProposer(ModelDrafting(ModelDrafter(draft, min_confidence=threshold))),
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
