"""Pipelining and draft-tier fallback change speed, never tokens."""

from __future__ import annotations

import asyncio

import pytest
from reference import target_only

from specdec.coordinator.clients import DraftClient, DraftClientConfig
from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.core.sampling import SamplingParams
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.registry import ModelDrafting, NgramDrafting
from specdec.draft_service.server import DraftServer
from specdec.draft_service.service import DraftCore
from specdec.local.in_process import LocalProposer, LocalVerifier
from specdec.target_service.verifier import TargetVerifier

PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]
SEEDED = SamplingParams(temperature=0.9, top_k=40, seed=3)


def _engine(tiny, drafter: str, **config) -> SpeculativeEngine:
    target = tiny("llama", 1)
    proposer = {
        "ngram": lambda: LocalProposer(NgramDrafting()),
        "self": lambda: LocalProposer(ModelDrafting(ModelDrafter(target))),
        "model": lambda: LocalProposer(ModelDrafting(ModelDrafter(tiny("llama", 2)))),
    }[drafter]()
    return SpeculativeEngine(
        proposer, LocalVerifier(TargetVerifier(target)), target, EngineConfig(adaptive=False, **config)
    )


@pytest.mark.parametrize("drafter", ["ngram", "self", "model"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SEEDED], ids=["greedy", "seeded"])
def test_pipelining_on_equals_off(tiny, drafter, sampling):
    request = GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=30, sampling=sampling, max_draft_tokens=3)
    on = asyncio.run(_engine(tiny, drafter, pipeline=True).generate(request))
    off = asyncio.run(_engine(tiny, drafter, pipeline=False).generate(request))
    assert on.token_ids == off.token_ids
    assert off.stats.pipelined_rounds == 0
    if drafter == "self" and sampling.greedy:
        # A perfect draft guesses every bonus: all rounds after the first come pipelined.
        assert on.stats.pipelined_rounds == on.stats.rounds - 1 > 0


class _Flaky:
    """Fault injection around a real proposer: fail or stall on chosen calls."""

    def __init__(self, inner, fail: set[int], stall: set[int], stall_s: float):
        self.inner, self.fail, self.stall, self.stall_s, self.calls = inner, fail, stall, stall_s, 0

    async def propose(self, session_id, tokens, k, sampling, model_k=None, affinity="", tree=False):
        self.calls += 1
        if self.calls in self.fail:
            raise ConnectionError("injected draft failure")
        if self.calls in self.stall:
            await asyncio.sleep(self.stall_s)
        return await self.inner.propose(session_id, tokens, k, sampling, model_k, affinity, tree)

    async def end_session(self, session_id, completion=()):
        await self.inner.end_session(session_id)


@pytest.mark.parametrize("sampling", [SamplingParams(), SEEDED], ids=["greedy", "seeded"])
def test_failing_and_slow_drafts_fall_back_without_changing_tokens(tiny, sampling):
    target = tiny("llama", 1)
    expected = target_only(target.model, PROMPT, 30, target.eos_token_ids, sampling)
    flaky = _Flaky(LocalProposer(NgramDrafting()), fail={2, 3}, stall={5}, stall_s=5.0)
    engine = SpeculativeEngine(
        flaky,
        LocalVerifier(TargetVerifier(target)),
        target,
        EngineConfig(draft_timeout_s=0.2, draft_retry_s=0.0, adaptive=False),
    )
    request = GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=30, sampling=sampling, max_draft_tokens=3)
    result = asyncio.run(asyncio.wait_for(engine.generate(request), 30))
    assert result.token_ids == expected
    assert result.stats.draft_failures == 3  # two errors and one proposal past the budget
    assert result.stats.non_speculative_rounds >= 3
    assert result.stats.draft_tokens > 0  # speculation came back after the faults


def test_draft_server_killed_and_restarted_mid_stream(tiny):
    target = tiny("llama", 1)
    expected = target_only(target.model, PROMPT, 60, target.eos_token_ids)

    async def scenario():
        first = DraftServer(DraftCore(target))  # the target drafts for itself: every draft accepted
        port = await first.start("127.0.0.1", 0)
        client = DraftClient(f"127.0.0.1:{port}", DraftClientConfig(timeout_s=2.0, reconnect_backoff_s=(0.05, 0.2)))
        engine = SpeculativeEngine(
            client,
            LocalVerifier(TargetVerifier(target)),
            target,
            EngineConfig(draft_timeout_s=2.0, draft_retry_s=0.0, adaptive=False),
        )
        stream = engine.stream(GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=60, max_draft_tokens=2))
        tokens, second = [], None
        async for index, delta in _enumerate(stream):
            tokens.extend(delta.token_ids)
            if index == 2:
                await first.stop(0)  # the draft tier goes away mid-stream
            if index == 6:
                second = DraftServer(DraftCore(target))
                await second.start("127.0.0.1", port)  # and comes back on the same address
                channel = next(iter(client._channels.values()))[0]
                await asyncio.wait_for(channel.channel_ready(), 10)
            final = delta
        await second.stop(0)
        await client.close()
        return tokens, final.stats, second.core.stats

    tokens, stats, second_stats = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert tokens == expected
    # Four rounds ran while the server was down; a proposal pipelined before the stop may serve one.
    assert stats.non_speculative_rounds >= 3 and stats.draft_failures >= 1
    assert second_stats.calls > 0 and stats.accepted_tokens > 0  # speculation resumed on the new server


async def _enumerate(stream):
    index = 0
    async for item in stream:
        yield index, item
        index += 1


class HybridLike:
    """Lookups for contexts ending in 7 (none otherwise); the model drafts [1, 2, ...] when allowed."""

    def __init__(self):
        self.calls: list[tuple[int, int | None]] = []  # (k, model_k) of every call

    async def propose(self, session_id, tokens, k, sampling, model_k=None, affinity="", tree=False):
        from specdec.core.acceptance import DraftProposal

        self.calls.append((k, model_k))
        if tokens[-1] == 7:
            return DraftProposal([7] * k, source="ngram")
        n = k if model_k is None else min(k, model_k)
        return DraftProposal(list(range(1, n + 1)), source="model")

    async def end_session(self, session_id, completion=()):
        return None


def test_a_lookup_only_pipelined_call_that_found_nothing_asks_the_model_again():
    from specdec.coordinator.drafting import DraftSide
    from specdec.core.acceptance import DraftProposal

    async def run():
        drafter = HybridLike()
        side = DraftSide(drafter, "s", SamplingParams(), pipeline=True, timeout_s=5.0, retry_s=1.0)
        side.prefetch([3, 4], DraftProposal([5]), 6, 2, 0)  # context [3, 4, 5, 6]: no lookup, model capped at 0
        drafts = await side.propose([3, 4, 5, 6], 2, 1)  # this round the model may draft one
        assert drafts.proposal.token_ids == [1] and drafts.proposal.source == "model" and side.pipelined_hits == 0
        assert drafter.calls == [(3, 0), (3, 2)]  # the lookup-only call, then the model's (one more: the guess)
        side.prefetch([3, 4], DraftProposal([5]), 7, 2, 0)  # context ends in 7: the lookup answers
        drafts = await side.propose([3, 4, 5, 7], 2, 1)
        assert drafts.proposal.token_ids == [7, 7] and side.pipelined_hits == 1 and len(drafter.calls) == 3

    asyncio.run(run())
