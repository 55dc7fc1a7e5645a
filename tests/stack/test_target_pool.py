"""The target tier as Ray actors: same outputs as in-process, batching, affinity, recovery."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import replace

import pytest
import ray

from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.registry import ModelDrafting, NgramDrafting
from specdec.local.in_process import LocalProposer, LocalVerifier
from specdec.target_service.actor import ActorConfig
from specdec.target_service.pool import (
    PoolConfig,
    TargetPool,
    TargetUnavailable,
    _Placement,
    actor_names,
    keep,
    launch,
)
from specdec.target_service.verifier import TargetVerifier

PROMPTS = [
    [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17],
    [9, 8, 7, 9, 8, 7, 1],
    [200, 3, 200, 4, 200],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
]
NEW_TOKENS = 20
_names = itertools.count()


@pytest.fixture
def pool_factory(ray_local, tiny_dir):
    made = []

    def make(replicas: int = 1, kind: str = "llama", **config) -> TargetPool:
        prefix = f"test-target-{next(_names)}"
        launch(ActorConfig(target_model=tiny_dir(kind, 1), **config), replicas, prefix=prefix, namespace="specdec-test")
        pool = TargetPool(PoolConfig(prefix=prefix, namespace="specdec-test", backoff_s=0.1))
        made.append(pool)
        return pool

    yield make
    for pool in made:
        for actor in pool.actors.values():
            ray.kill(actor, no_restart=True)


def _engines(tiny, pool, drafter: str):
    target = tiny("llama", 1)
    proposer = (
        LocalProposer(NgramDrafting())
        if drafter == "ngram"
        else LocalProposer(ModelDrafting(ModelDrafter(tiny("llama", 2))))
    )
    config = EngineConfig(max_draft_tokens=8, adaptive=False)
    remote = SpeculativeEngine(proposer, pool, target, config)
    local = SpeculativeEngine(proposer, LocalVerifier(TargetVerifier(target)), target, config)
    return remote, local


async def _run_all(engine, requests):
    return await asyncio.gather(*(engine.generate(r) for r in requests))


def _run_with_fault_midway(pool, engine, requests, fault):
    """Run `requests` (one per prompt of PROMPTS) on `engine`; once all are placed and one has
    generated a few tokens, await `fault()`. Returns the results in order."""

    async def midway():
        while len(pool.sessions) < len(PROMPTS) or max(p.held for p in pool.sessions.values()) < 13 + 4:
            await asyncio.sleep(0.005)
        await fault()

    async def scenario():
        faulting = asyncio.create_task(asyncio.wait_for(midway(), 60))
        results = await asyncio.wait_for(_run_all(engine, requests), 120)
        await faulting
        return results

    return asyncio.run(scenario())


def test_rounds_without_drafts_are_decoded_ahead_with_the_same_tokens(tiny, pool_factory):
    """Target-only requests: the actor runs each session's next round before its coordinator
    sends it (target_service/lookahead.py); greedy and seeded outputs are in-process target-only
    decoding's, and the look-aheads of finished requests leave no session and no block behind
    by the time their requests return."""
    pool = pool_factory()
    remote, local = _engines(tiny, pool, "ngram")
    actor = next(iter(pool.actors.values()))
    for sampling in (SamplingParams(), SamplingParams(temperature=0.9, top_k=50, seed=5)):
        requests = [
            GenerationRequest(prompt_token_ids=p, max_new_tokens=NEW_TOKENS, sampling=sampling, speculate=False)
            for p in PROMPTS
        ]
        expected = [asyncio.run(local.generate(r)).token_ids for r in requests]
        before = ray.get(actor.info.remote())["lookahead_hits"]
        got = asyncio.run(_run_all(remote, requests))
        assert [g.token_ids for g in got] == expected
        # From a session's third round on, its rounds can be answered by the round run ahead.
        info = ray.get(actor.info.remote())
        assert info["lookahead_hits"] - before >= len(PROMPTS) * (NEW_TOKENS - 4) // 2
        # end_session returns once the session is freed, even while a look-ahead's pass holds
        # it: a finished request has left nothing behind when its generate returns.
        assert info["sessions"] == 0 and info["kv_blocks_used"] == 0


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_pool_gives_in_process_outputs(tiny, pool_factory, drafter):
    pool = pool_factory()
    remote, local = _engines(tiny, pool, drafter)
    sampled = SamplingParams(temperature=0.9, top_k=50, seed=5)
    for sampling in (SamplingParams(), sampled):
        requests = [
            GenerationRequest(prompt_token_ids=p, max_new_tokens=NEW_TOKENS, sampling=sampling, max_draft_tokens=4)
            for p in PROMPTS
        ]
        expected = [asyncio.run(local.generate(r)).token_ids for r in requests]
        got = asyncio.run(_run_all(remote, requests))
        assert [g.token_ids for g in got] == expected
    info = ray.get(next(iter(pool.actors.values())).info.remote())
    if drafter == "ngram":
        # Concurrent requests shared forward passes. (With the model drafter the in-process
        # proposer's lock serializes the drafts, so rounds reach the actor one by one unless
        # their verifications happen to overlap: whether they batch is timing, not behaviour.)
        assert max(info["batch_sizes"]) > 1
    assert info["sessions"] == 0  # every finished request ended its session


def test_two_actors_spread_sessions_and_keep_them(tiny, pool_factory):
    pool = pool_factory(replicas=2)
    target = tiny("llama", 1)
    engine = SpeculativeEngine(LocalProposer(NgramDrafting()), pool, target)
    seen: dict[str, set[str]] = {}
    original = pool._placement

    def spy(session_id):
        placement = original(session_id)
        seen.setdefault(session_id, set()).add(placement.actor)
        return placement

    pool._placement = spy
    requests = [GenerationRequest(prompt_token_ids=p, max_new_tokens=NEW_TOKENS) for p in PROMPTS]
    asyncio.run(_run_all(engine, requests))
    assert len(seen) == len(PROMPTS)
    assert all(len(actors) == 1 for actors in seen.values())  # affinity: one actor per session
    assert len(set().union(*seen.values())) == 2  # spread over both


def test_killed_actor_loses_no_request(tiny, pool_factory):
    pool = pool_factory()
    remote, local = _engines(tiny, pool, "ngram")
    requests = [GenerationRequest(prompt_token_ids=p, max_new_tokens=NEW_TOKENS, max_draft_tokens=2) for p in PROMPTS]
    expected = [asyncio.run(local.generate(r)).token_ids for r in requests]
    actor = next(iter(pool.actors.values()))

    async def kill():  # Ray revives it with empty caches
        ray.kill(actor, no_restart=False)

    results = _run_with_fault_midway(pool, remote, requests, kill)
    assert [r.token_ids for r in results] == expected
    assert pool.resends >= len(PROMPTS)  # the recovery path really ran


def test_unknown_session_misses_and_oversize_round_is_refused(tiny, pool_factory):
    from specdec.core.acceptance import DraftProposal
    from specdec.target_service.protocol import VerifyRequest

    pool = pool_factory()
    actor = next(iter(pool.actors.values()))
    greedy = SamplingParams()
    miss = ray.get(actor.verify.remote(VerifyRequest("nobody", 5, [1, 2], [], None, greedy)))
    assert miss.miss and miss.verification is None
    too_long = ray.get(actor.verify.remote(VerifyRequest("big", 0, [1] * 250, [2] * 8, None, greedy)))
    assert too_long.error and "context" in too_long.error and too_long.verification is None
    with pytest.raises(ValueError, match="context"):
        asyncio.run(pool.verify("big2", [1] * 250, DraftProposal([2] * 8), greedy))


def test_cli_resizes_a_running_pool(ray_local, tiny_dir):
    from specdec.target_service.__main__ import main
    from specdec.target_service.pool import actor_names

    address = ray.get_runtime_context().gcs_address
    args = [
        "--address",
        address,
        "--namespace",
        "specdec-test",
        "--name",
        "cli-pool",
        "--target-model",
        tiny_dir("llama", 1),
    ]
    try:
        assert main(args + ["--replicas", "2"]) == 0
        assert actor_names("cli-pool", "specdec-test") == ["cli-pool-0", "cli-pool-1"]
        assert main(args + ["--replicas", "1"]) == 0
        assert actor_names("cli-pool", "specdec-test") == ["cli-pool-0"]
    finally:
        for name in actor_names("cli-pool", "specdec-test"):
            ray.kill(ray.get_actor(name, namespace="specdec-test"), no_restart=True)


def test_verify_span_joins_the_callers_trace_inside_the_actor(pool_factory):
    from opentelemetry.sdk.trace import TracerProvider

    from specdec.core.acceptance import DraftProposal

    pool = pool_factory(trace_in_memory=True)
    tracer = TracerProvider().get_tracer("test")  # a provider of the test's own: no global state
    with tracer.start_as_current_span("specdec.round") as parent:
        asyncio.run(pool.verify("traced", [5, 6, 7, 8], DraftProposal([9, 10]), SamplingParams()))
    context = parent.get_span_context()
    spans = ray.get(next(iter(pool.actors.values())).finished_spans.remote())
    verify = [s for s in spans if s["name"] == "specdec.verify"]
    assert len(verify) == 1
    assert verify[0]["trace_id"] == f"{context.trace_id:032x}"
    assert verify[0]["parent_span_id"] == f"{context.span_id:016x}"
    assert verify[0]["attributes"]["specdec.k"] == 2


def _round(session: str, tokens: list[int]):
    from specdec.core.acceptance import DraftProposal

    return session, tokens, DraftProposal([7, 8]), SamplingParams()


def test_new_sessions_go_where_the_actors_report_least_load(tiny_dir, pool_factory):
    """Two coordinators' pools over the same two actors: the second places a new session by
    what the actors report (the first pool's sessions), not by its own empty view."""
    first = pool_factory(replicas=2)
    second = TargetPool(PoolConfig(prefix=first.config.prefix, namespace="specdec-test", load_poll_s=0.0))

    async def scenario():
        for i in range(3):  # 2 + 1 over the actors, whichever way the tie breaks
            await first.verify(*_round(f"a{i}", PROMPTS[i]))
        await second.verify(*_round("b0", PROMPTS[3]))

    asyncio.run(scenario())
    held = {name: sum(p.actor == name for p in first.sessions.values()) for name in first.actors}
    assert sorted(held.values()) == [1, 2]
    assert second.sessions["b0"].actor == min(held, key=held.get)
    loads = [ray.get(actor.load.remote()) for actor in first.actors.values()]
    assert sorted(load["sessions"] for load in loads) == [2, 2]  # b0 evened them out
    assert all(load["kv_blocks_used"] > 0 and load["kv_blocks_total"] > load["kv_blocks_used"] for load in loads)


def test_full_queues_place_sessions_elsewhere_then_refuse(tiny, pool_factory):
    """max_queue 1: rounds an actor cannot queue go to the other actor; with every queue full the
    pool raises TargetOverloaded (RESOURCE_EXHAUSTED at the API), and all other rounds are right."""
    from specdec.target_service.pool import TargetOverloaded

    pool = pool_factory(replicas=2, max_queue=1, max_batch=1)
    verifier = TargetVerifier(tiny("llama", 1))
    rounds = [_round(f"s{i}", PROMPTS[i % 4] + [i]) for i in range(24)]

    async def scenario():
        return await asyncio.gather(*(pool.verify(*r) for r in rounds), return_exceptions=True)

    results = asyncio.run(scenario())
    refused = [r for r in results if isinstance(r, TargetOverloaded)]
    answered = [(r, rnd) for r, rnd in zip(results, rounds) if not isinstance(r, Exception)]
    assert refused and answered and len(refused) + len(answered) == len(rounds)
    assert all(result == verifier.verify(*rnd) for result, rnd in answered)
    assert {p.actor for p in pool.sessions.values()} == set(pool.actors)  # both actors took rounds
    assert not any(f"s{i}" in pool.sessions for i, r in enumerate(results) if isinstance(r, TargetOverloaded))


def test_a_stalled_actor_costs_a_move_not_a_hung_request(tiny, pool_factory):
    """SIGSTOP one of two actors: a round placed there waits verify_timeout_s, then its session
    moves to the other actor and the round is answered there."""
    import os
    import signal

    pool = pool_factory(replicas=2)
    pool = TargetPool(replace(pool.config, verify_timeout_s=1.0))
    names = sorted(pool.actors)
    stalled = ray.get(pool.actors[names[0]].info.remote())["pid"]
    verifier = TargetVerifier(tiny("llama", 1))
    os.kill(stalled, signal.SIGSTOP)
    try:
        pool.sessions["s"] = _Placement(names[0])  # as if placed there before it stalled
        started = time.monotonic()
        result = asyncio.run(asyncio.wait_for(pool.verify(*_round("s", PROMPTS[0])), 30))
        waited = time.monotonic() - started
    finally:
        os.kill(stalled, signal.SIGCONT)
    assert result == verifier.verify(*_round("s", PROMPTS[0]))
    assert pool.sessions["s"].actor == names[1] and 1.0 <= waited < 15


def test_a_pool_without_actors_is_unreachable_and_its_rounds_unavailable_until_actors_return(
    tiny, tiny_dir, pool_factory
):
    """Every actor gone (a head restart, a pool scaled to zero): `reachable` says so (the
    coordinator's health turns NOT_SERVING) and a round gets TargetUnavailable (UNAVAILABLE at the
    API), never an internal error; actors created again under the same names serve again."""
    pool = pool_factory()
    remote, _ = _engines(tiny, pool, "ngram")
    request = GenerationRequest(prompt_token_ids=PROMPTS[0], max_new_tokens=4, max_draft_tokens=2)
    assert asyncio.run(pool.reachable())
    for actor in pool.actors.values():
        ray.kill(actor, no_restart=True)
    assert not asyncio.run(pool.reachable()) and pool.actors == {}
    with pytest.raises(TargetUnavailable):
        asyncio.run(remote.generate(request))
    launch(ActorConfig(target_model=tiny_dir("llama", 1)), 1, prefix=pool.config.prefix, namespace="specdec-test")
    assert asyncio.run(pool.reachable())
    assert len(asyncio.run(remote.generate(request)).token_ids) == 4


def test_a_token_tree_crosses_to_the_actor_and_decides_as_in_process(tiny, pool_factory):
    """Tree rounds through the pool (parent indices travel with the drafts) give the in-process
    verifier's verdicts, and the second round finds the first one's accepted path held."""
    from specdec.core import tree

    pool = pool_factory()
    local = TargetVerifier(tiny("llama", 1))
    sampling = SamplingParams(temperature=0.9, top_k=40, seed=3)
    context = list(PROMPTS[0])
    for branches in ([[5, 17], [42, 99, 7], [5, 120]], [[33, 64], [7, 5, 17, 42]]):
        tokens, parents = tree.from_branches(branches)
        proposal = DraftProposal(tokens, parents=parents)
        got = asyncio.run(pool.verify("tree", context, proposal, sampling))
        assert got == local.verify("tree", context, proposal, sampling)
        context += got.accepted_ids
    assert pool.resends == 0  # the actor held what the pool expected after the tree round


def test_while_the_head_cannot_be_asked_the_pool_serves_with_the_handles_it_holds(tiny, pool_factory):
    """The head down: a lookup of the actors by name blocks (Ray retries it), but calls to the
    actors do not cross the head. Lookups run off the event loop, bounded, and a failed one keeps
    the handles: rounds go on with the same output and health stays SERVING."""
    pool = pool_factory()
    pool.config = replace(pool.config, refresh_s=0.0, lookup_timeout_s=0.2)
    remote, local = _engines(tiny, pool, "ngram")
    head_back = threading.Event()
    lookups = []

    def blocked_lookup():
        lookups.append(time.monotonic())
        head_back.wait(30)

    pool.refresh = blocked_lookup
    request = GenerationRequest(prompt_token_ids=PROMPTS[0], max_new_tokens=8, max_draft_tokens=2)

    async def head_down():
        try:
            started = time.monotonic()
            serving = await pool.reachable()
            got = await remote.generate(request)
            return serving, got, time.monotonic() - started
        finally:
            head_back.set()  # the blocked lookups end before this loop closes (it waits for them)

    serving, got, took = asyncio.run(head_down())
    assert serving and lookups and len(pool.actors) == 1
    assert took < 10, took  # bounded lookups, not Ray's retries
    assert got.token_ids == asyncio.run(local.generate(request)).token_ids


def test_resizing_under_load_drains_the_removed_actor_and_loses_no_round(tiny, tiny_dir, pool_factory):
    """2 -> 1 actors while four requests generate: the removed actor stops taking rounds, its
    sessions move (with their context) to the other, it goes once its queued rounds are done; every
    request ends with the in-process output."""
    pool = pool_factory(2)
    remote, local = _engines(tiny, pool, "ngram")
    requests = [GenerationRequest(prompt_token_ids=p, max_new_tokens=NEW_TOKENS, max_draft_tokens=2) for p in PROMPTS]
    expected = [asyncio.run(local.generate(r)).token_ids for r in requests]
    removed = f"{pool.config.prefix}-1"

    async def shrink():
        assert any(p.actor == removed for p in pool.sessions.values())  # the drain has sessions to move
        config = ActorConfig(target_model=tiny_dir("llama", 1))
        await asyncio.to_thread(launch, config, 1, pool.config.prefix, "specdec-test")

    results = _run_with_fault_midway(pool, remote, requests, shrink)
    assert [r.token_ids for r in results] == expected
    assert actor_names(pool.config.prefix, "specdec-test") == [f"{pool.config.prefix}-0"]
    assert all(p.actor != removed for p in pool.sessions.values())


def test_the_keeper_creates_missing_actors_again(tiny_dir, pool_factory):
    """`specdec target --keep`: actors that vanish (a head restart loses them all) are created
    again under their names, with no manual step."""
    pool = pool_factory(1)
    prefix = pool.config.prefix
    stop = threading.Event()
    keeper = threading.Thread(
        target=keep, args=(ActorConfig(target_model=tiny_dir("llama", 1)), 2, prefix, "specdec-test", 0.2, stop)
    )
    keeper.start()
    try:
        deadline = time.monotonic() + 60
        while actor_names(prefix, "specdec-test") != [f"{prefix}-0", f"{prefix}-1"]:
            assert time.monotonic() < deadline, "the keeper did not grow the pool"
            time.sleep(0.1)
        ray.kill(ray.get_actor(f"{prefix}-0", namespace="specdec-test"), no_restart=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                info = ray.get(ray.get_actor(f"{prefix}-0", namespace="specdec-test").info.remote(), timeout=30)
                break
            except (ValueError, ray.exceptions.RayActorError):
                assert time.monotonic() < deadline, "the keeper did not create the killed actor again"
                time.sleep(0.1)
        assert info["sessions"] == 0
    finally:
        stop.set()
        keeper.join(30)
        pool.refresh()  # the fixture removes what the pool names: both actors now


def test_rounds_come_back_with_the_pass_that_decided_them(pool_factory):
    """The pass cost the draft-length policy prices rounds by crosses Ray with each round: a
    prefill's pass is no round's cost; decode rounds sharing a pass all report it whole."""
    pool = pool_factory()
    drafts = {"c0": [], "c1": [7], "c2": [7, 8], "c3": [7, 8, 9]}

    async def scenario():
        prompts = {s: PROMPTS[i] for i, s in enumerate(drafts)}
        first = await asyncio.gather(
            *(pool.verify(s, p, DraftProposal([]), SamplingParams()) for s, p in prompts.items())
        )
        assert all(result.cost is None for result in first)  # each pass prefilled
        grown = {s: p + result.accepted_ids for (s, p), result in zip(prompts.items(), first)}
        return await asyncio.gather(
            *(pool.verify(s, grown[s], DraftProposal(drafts[s]), SamplingParams()) for s in drafts)
        )

    results = asyncio.run(scenario())
    passes: dict = {}
    for session, result in zip(drafts, results):
        assert result.cost is not None and result.cost.seconds > 0 and not result.cost.ahead, result
        passes.setdefault(result.cost, []).append(len(drafts[session]) + 1)
    # However the actor batched them, each pass counts its own rounds and their k + 1 positions.
    assert all(cost.rows == len(own) and cost.positions == sum(own) for cost, own in passes.items()), passes
