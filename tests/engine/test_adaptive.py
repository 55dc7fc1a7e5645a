"""Adaptive draft length: the Leviathan et al. choice of k from acceptance and measured costs,
its cost model, and the engine using it (and turning speculation off under load) without
changing a single output token."""

from __future__ import annotations

import asyncio
import math

import pytest
from reference import target_only

from specdec.coordinator.adaptive import (
    LOOKUP,
    MODEL,
    Acceptance,
    CostModel,
    SourcedAcceptance,
    best_k,
    draft_lengths,
    expected_tokens,
    ideal_speedup,
)
from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.core.acceptance import DraftProposal, PassCost
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.registry import ModelDrafting
from specdec.local.in_process import LocalProposer, LocalVerifier
from specdec.target_service.verifier import TargetVerifier

PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]


class FakeClock:
    """The engine's clock in these tests: it moves only when a fake tier says a call took time, so
    the cost model sees exactly the costs a test sets, whatever else the machine is doing."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_expected_tokens_is_the_truncated_geometric_sum():
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 8) == 9.0
    assert math.isclose(expected_tokens(0.5, 2), 1 + 0.5 + 0.25)
    assert math.isclose(ideal_speedup(0.5, 2, cost_ratio=0.0), 1.75)
    assert math.isclose(ideal_speedup(0.5, 2, cost_ratio=0.1, verify_ratio=1.2), 1.75 / 1.4)


def cpu_like(flat: bool = False, draft_s: float = 0.0) -> CostModel:
    """Verify costs of Gemma 3 270M on 2 cores without the CPU kernels of
    specdec/runtime/projection.py (docs/performance.md): 115 ms for one position, a jump to about
    160 ms for two (the output projection changes kernels), then about 12 ms per position up to
    259 ms for nine. `flat`: a GPU, where positions are free."""
    costs = CostModel()
    for n in range(1, 10):
        costs.observe_verify(n, 0.115 if flat or n == 1 else 0.160 + 0.0124 * (n - 2))
    costs.observe_draft(1, draft_s)
    return costs


def test_best_k_backs_off_on_free_text_and_drafts_long_on_copies():
    costs = cpu_like()
    assert best_k(0.24, costs, 8) == 0  # n-gram drafts on free text: every draft costs more than it brings
    assert best_k(0.95, costs, 8) == 8  # copying: the longest draft wins
    assert 0 < best_k(0.6, costs, 8) < 8
    flat = cpu_like(flat=True)  # a GPU: extra positions are nearly free, so draft as far as allowed
    assert best_k(0.24, flat, 8) >= 3  # (beyond, alpha^k adds under 0.1%: a near tie goes to the shorter draft)
    assert best_k(0.9, flat, 8) == 8
    assert best_k(0.95, cpu_like(draft_s=1.0), 8) == 0  # a draft that costs more than a target step never pays
    assert best_k(0.95, costs, 3) == 3  # the request's bound holds


def test_cost_model_interpolates_and_extrapolates_unseen_lengths():
    costs = CostModel(prior_slope=0.1)
    assert costs.verify(1) == 1.0 and math.isclose(costs.verify(9), 1.8)  # no measurement: the prior's ratios
    costs.observe_verify(1, 0.1)
    costs.observe_verify(9, 0.3)
    assert math.isclose(costs.verify(5), 0.2)  # between two measured lengths: the line through them
    costs.observe_verify(9, 0.4)  # load: the median of two passes
    assert math.isclose(costs.verify(9), 0.35)
    costs.observe_verify(9, 0.4)  # two of three: it shows in full
    assert math.isclose(costs.verify(9), 0.4)
    assert math.isclose(costs.verify(13), 0.4 * (1 + 1.2) / (1 + 0.8))  # beyond: the prior slope from the nearest


def test_one_stalled_pass_does_not_price_a_length_out_of_reach():
    costs = CostModel()
    costs.observe_verify(3, 1.0)  # the first pass of this length stalled (a collection, a kernel's first use)
    costs.observe_verify(3, 0.06)
    costs.observe_verify(3, 0.06)  # measured twice more: two good passes outvote the stall
    assert costs.verify(3) == 0.06
    for _ in range(2):
        costs.observe_verify(3, 0.06)
    costs.observe_verify(3, 2.0)  # a stall among good passes moves nothing
    assert costs.verify(3) == 0.06


def test_a_model_never_measured_is_not_priced_free():
    """A hybrid's model rounds seldom follow each other, and only those measure its cost: until
    one does, a model costs a typical c, so one right 7% of the time does not draft where a verify
    position is cheap (here 5% of a pass). A lookup is still free, and a measured model its own."""
    costs = CostModel()
    costs.observe_verify(1, 0.100)
    costs.observe_verify(2, 0.105)
    assert best_k(0.07, costs, 8, MODEL) == 0
    assert best_k(0.07, costs, 8, LOOKUP) == 1
    costs.observe_draft(1, 0.0, MODEL)  # measured: a model that costs nothing drafts like a lookup
    assert best_k(0.07, costs, 8, MODEL) == 1


def test_a_slow_short_pass_is_not_priced_above_a_longer_one():
    costs = CostModel()
    costs.observe_verify(1, 0.042)  # slow samples: the machine was busy then
    costs.observe_verify(2, 0.040)
    costs.observe_verify(4, 0.050)
    assert costs.verify(1) == 0.040 and costs.verify(2) == 0.040 and costs.verify(3) == 0.045
    # At face value a model right 8% of the time drafted (1.08 tokens for 0.040 + 0.004 s against 1 for 0.042 s).
    assert best_k(0.08, costs, 1, MODEL) == 0
    costs.observe_verify(4, 2.0)
    costs.observe_verify(4, 2.0)  # a stalled longer length moves no shorter one
    assert costs.verify(2) == 0.040


def test_draft_lengths_cap_the_model_where_lookups_pay_and_it_does_not():
    costs = CostModel()
    for n in range(1, 10):
        costs.observe_verify(n, 0.1 + 0.016 * (n - 1))  # this CPU: +0.16 of a step per position
    costs.observe_draft(1, 0.0005, LOOKUP)
    costs.observe_draft(1, 0.013, MODEL)  # c = 0.13
    acceptance = SourcedAcceptance()
    for _ in range(20):
        acceptance.observe("ngram", 4, 4)
        acceptance.observe("model", 1, 0)
    assert draft_lengths(acceptance, costs, 8, {LOOKUP}).model_k is None  # one source: nothing to cap
    both = draft_lengths(acceptance, costs, 8, {LOOKUP, MODEL})
    assert both.k >= 4 and both.model_k == 0
    assert draft_lengths(acceptance, costs, 8, {MODEL}).k == 0  # a lone model that is always wrong drafts nothing


def test_acceptance_counts_the_positions_the_target_judged():
    a = Acceptance(decay=1.0, accepted=0.0, tested=0.0)
    a.observe(4, 2)  # two accepted, the third rejected, the fourth never judged
    a.observe(3, 3)  # all accepted
    a.observe(0, 0)  # no drafts: no information
    assert a.tested == 6 and a.accepted == 5


class CountingVerifier(LocalVerifier):
    """A verifier whose pass costs grow with its positions, as a CPU's do, and that records them."""

    def __init__(self, verifier, clock: FakeClock, per_position_s: float, base_s: float = 0.004):
        super().__init__(verifier)
        self.clock = clock
        self.per_position_s = per_position_s
        self.base_s = base_s
        self.positions: list[int] = []

    async def verify(self, session_id, tokens, proposal, sampling):
        positions = len(proposal.token_ids) + 1
        self.positions.append(positions)
        seconds = self.base_s + self.per_position_s * len(proposal.token_ids)
        self.clock.advance(seconds)
        result = await super().verify(session_id, tokens, proposal, sampling)
        if result.cost is not None:  # the pass on the fake clock, not the tiny model's real one
            result.cost = PassCost(1, positions, seconds)
        return result


class WrongDrafter:
    """Always proposes tokens the target will not pick (its own argmax shifted by one id)."""

    def __init__(self, drafter: ModelDrafter):
        self.inner = LocalProposer(ModelDrafting(drafter))

    async def propose(self, session_id, tokens, k, sampling, model_k=None, affinity="", tree=False):
        proposal = await self.inner.propose(session_id, tokens, k, sampling, model_k, affinity, tree)
        return DraftProposal([(t + 1) % 50 for t in proposal.token_ids])

    async def end_session(self, session_id, completion=()):
        await self.inner.end_session(session_id)


class TwoSourceDrafter:
    """A hybrid as the engine sees it: rounds at even context lengths are lookups the target
    accepts (the self-draft, source "ngram"), the others model drafts it rejects, at 5 ms a token."""

    def __init__(self, target, clock: FakeClock):
        self.clock = clock
        self.right = LocalProposer(ModelDrafting(ModelDrafter(target)))
        self.lookup_ks: list[int] = []
        self.model_ks: list[int] = []  # what the model was allowed to draft, per model round

    async def propose(self, session_id, tokens, k, sampling, model_k=None, affinity="", tree=False):
        if len(tokens) % 2 == 0:
            self.lookup_ks.append(k)
            return DraftProposal((await self.right.propose(session_id, tokens, k, sampling)).token_ids, source="ngram")
        n = k if model_k is None else min(k, model_k)
        self.model_ks.append(n)
        self.clock.advance(0.005 * n)
        ids = (await self.right.propose(session_id, tokens, n, sampling)).token_ids if n else []
        return DraftProposal([(t + 1) % 50 for t in ids], source="model")

    async def end_session(self, session_id, completion=()):
        await self.right.end_session(session_id)


@pytest.mark.parametrize("pipeline", [False, True], ids=["sequential", "pipelined"])
def test_lookups_and_model_drafts_are_priced_apart(tiny, pipeline):
    """One α for both made k a compromise; per source, the model is capped at 0 (a 1-token probe
    every 8 rounds) while lookups keep drafting long, and the output stays the target's.
    Pipelined calls ask for one token more (the guess of the bonus), but never of a model at 0."""
    drafter = None

    def build(target, clock):
        nonlocal drafter
        drafter = TwoSourceDrafter(target, clock)
        return drafter

    result, _ = _adaptive_run(tiny, build, base_s=0.03, tokens=160, pipeline=pipeline)
    later = drafter.model_ks[len(drafter.model_ks) // 2 :]
    # Capped at 0 in most of its later rounds (a probe is a round in 8 of all, lookups included;
    # a pipelined round asks one token more); without the split every model round drafted 2-3.
    assert later and max(later) <= 1 + pipeline and later.count(0) >= len(later) // 2, (
        drafter.model_ks,
        drafter.lookup_ks,
    )
    assert sum(drafter.lookup_ks[1:]) / max(len(drafter.lookup_ks) - 1, 1) >= 3  # lookups still draft long
    assert result.stats.accepted_tokens > 0


def _adaptive_run(tiny, proposer, base_s: float = 0.004, tokens: int = 40, pipeline: bool = False):
    """`tokens` (40) greedy tokens through an adaptive engine whose verify costs grow with positions; the
    output must be the target's whatever k the engine picked."""
    target = tiny("llama", 1)
    clock = FakeClock()
    verifier = CountingVerifier(TargetVerifier(target), clock, per_position_s=0.003, base_s=base_s)
    config = EngineConfig(max_draft_tokens=8, pipeline=pipeline)
    engine = SpeculativeEngine(proposer(target, clock), verifier, target, config, clock=clock)
    result = asyncio.run(
        engine.generate(GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=tokens, max_draft_tokens=8))
    )
    assert result.token_ids == target_only(target.model, PROMPT, tokens, target.eos_token_ids)[: len(result.token_ids)]
    return result, verifier


def test_adaptive_engine_stops_drafting_what_is_rejected_and_keeps_the_output(tiny):
    result, verifier = _adaptive_run(tiny, lambda target, clock: WrongDrafter(ModelDrafter(target)))
    drafted = [n - 1 for n in verifier.positions]
    assert drafted[0] == 0 and drafted[1] > 0  # the prefill round drafts nothing, then the prior (alpha 0.5) does
    later = drafted[len(drafted) // 2 :]
    assert (
        max(later) <= 1 and later.count(0) >= len(later) - len(later) // 8 - 1
    )  # k = 0, a 1-token probe every 8 rounds
    assert result.stats.accepted_tokens == 0


class DecliningDrafter:
    """A draft model whose confidence stop declines every draft: each call costs 5 ms, proposes nothing."""

    def __init__(self):
        self.calls = 0
        self.clock: FakeClock | None = None

    async def propose(self, session_id, tokens, k, sampling, model_k=None, affinity="", tree=False):
        self.calls += 1
        self.clock.advance(0.005)
        return DraftProposal([], source="model")

    async def end_session(self, session_id, completion=()):
        pass


def test_a_model_that_declines_its_drafts_stops_being_asked(tiny):
    """A decline is priced as a rejected draft: the engine stops asking (a probe 1 round in 8)
    instead of paying a model call every round at alpha's prior."""
    drafter = DecliningDrafter()

    def build(target, clock):
        drafter.clock = clock
        return drafter

    result, verifier = _adaptive_run(tiny, build, tokens=40)
    assert result.stats.draft_tokens == 0 and len(verifier.positions) == 40
    assert drafter.calls <= 40 // 8 + 4, drafter.calls  # a few at the prior, then probes


def test_adaptive_engine_keeps_long_drafts_when_they_are_accepted(tiny):
    # On the fake clock a pass costs 30 ms plus 3 ms a position and the self-draft nothing.
    result, verifier = _adaptive_run(
        tiny, lambda target, clock: LocalProposer(ModelDrafting(ModelDrafter(target))), base_s=0.03
    )
    assert result.stats.acceptance_rate == 1.0
    # The self-draft is always right: drafts stay long, so 40 tokens take a handful of rounds, not 40.
    drafted = [n - 1 for n in verifier.positions[1:-1]]
    assert sum(drafted) / len(drafted) >= 4 and len(verifier.positions) <= 12


class StallingVerifier(CountingVerifier):
    """Its first pass over `positions` positions after the prompt's stalls for `stall_s` (as a
    first-use kernel setup did)."""

    def __init__(self, verifier, positions: int, stall_s: float, **kw):
        super().__init__(verifier, **kw)
        self.stall_at, self.stall_s = positions, stall_s

    async def verify(self, session_id, tokens, proposal, sampling):
        # The first round's pass (with the prompt's prefill) is not a round's cost: not that one.
        if self.positions and len(proposal.token_ids) + 1 == self.stall_at and self.stall_s:
            stall, self.stall_s = self.stall_s, 0.0
            self.clock.advance(stall)
        return await super().verify(session_id, tokens, proposal, sampling)


def test_a_stalled_pass_does_not_keep_k_below_its_best(tiny):
    """The self-draft is always right, so k = 8 (9 positions) pays; the first 9-position pass after
    the prompt's stalls for 0.5 s (about 5x a pass). Priced by a mean, that one stall would keep k
    below 8 for the rest of the request, and nothing would measure 9 positions again; probes one
    draft up and median costs bring it back once two good passes outvote the stall."""
    target = tiny("llama", 1)
    clock = FakeClock()
    verifier = StallingVerifier(
        TargetVerifier(target), clock=clock, positions=9, stall_s=0.5, per_position_s=0.01, base_s=0.03
    )
    config = EngineConfig(max_draft_tokens=8, pipeline=False, probe_every=4)
    engine = SpeculativeEngine(
        LocalProposer(ModelDrafting(ModelDrafter(target))), verifier, target, config, clock=clock
    )
    result = asyncio.run(
        engine.generate(GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=240, max_draft_tokens=8))
    )
    assert result.token_ids == target_only(target.model, PROMPT, 240, target.eos_token_ids)[: len(result.token_ids)]
    drafted = [n - 1 for n in verifier.positions[1:-1]]
    stalled = drafted.index(8)  # the first 9-position pass after the prompt's
    assert 8 in drafted[stalled + 1 :], drafted


def _loaded_engine(tiny, **load_config) -> tuple[SpeculativeEngine, CountingVerifier, GenerationRequest]:
    """A self-drafting engine (always right, flat costs: it drafts the request's max alone) with
    the given load awareness, and a request allowing k = 4. On the fake clock a pass takes 30 ms
    and the self-draft nothing, so k = 4 is the clear best alone."""
    target = tiny("llama", 1)
    clock = FakeClock()
    verifier = CountingVerifier(TargetVerifier(target), clock, per_position_s=0.0, base_s=0.03)
    config = EngineConfig(max_draft_tokens=8, pipeline=False, **load_config)
    engine = SpeculativeEngine(
        LocalProposer(ModelDrafting(ModelDrafter(target))), verifier, target, config, clock=clock
    )
    return engine, verifier, GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=24, max_draft_tokens=4)


def test_speculation_turns_off_under_load_and_comes_back(tiny):
    engine, _, request = _loaded_engine(tiny, speculation_max_running=2)
    alone = asyncio.run(engine.generate(request))
    assert alone.stats.draft_tokens > 0
    engine.running = 2  # two others generating: with this request, three > 2
    loaded = asyncio.run(engine.generate(request))
    assert loaded.token_ids == alone.token_ids
    assert loaded.stats.draft_tokens == 0 and loaded.stats.non_speculative_rounds == loaded.stats.rounds == 24
    engine.running = 0  # load gone: speculation back
    assert asyncio.run(engine.generate(request)).stats.draft_tokens > 0


def test_a_token_budget_shrinks_drafts_as_load_grows_then_turns_them_off(tiny):
    engine, verifier, request = _loaded_engine(tiny, speculation_token_budget=8)

    def longest_draft(running_others: int):
        engine.running = running_others
        start = len(verifier.positions)
        result = asyncio.run(engine.generate(request))
        return result, max(n - 1 for n in verifier.positions[start:])

    alone, k_alone = longest_draft(0)  # budget 8 for one request: the request's own max, 4
    assert k_alone == 4
    shared, k_shared = longest_draft(3)  # four generating: 8 // 4 - 1 = 1 draft each at most
    assert k_shared == 1 and shared.stats.draft_tokens > 0
    crowded, k_crowded = longest_draft(7)  # eight: a position each, no room for drafts
    assert k_crowded == 0 and crowded.stats.draft_tokens == 0
    assert alone.token_ids == shared.token_ids == crowded.token_ids
    engine.running = 0
    assert asyncio.run(engine.generate(request)).stats.draft_tokens > 0  # load gone: drafts back


class SlowFirstCall:
    """A self-draft (always right) whose first call is slow, as a draft model's prompt prefill is."""

    def __init__(self, drafter: ModelDrafter, clock: FakeClock, first_s: float):
        self.clock = clock
        self.inner = LocalProposer(ModelDrafting(drafter))
        self.first_s = first_s
        self.calls = 0

    async def propose(self, session_id, tokens, k, sampling, model_k=None, affinity="", tree=False):
        self.calls += 1
        if self.calls == 1:
            self.clock.advance(self.first_s)
        return await self.inner.propose(session_id, tokens, k, sampling, model_k, affinity, tree)

    async def end_session(self, session_id, completion=()):
        await self.inner.end_session(session_id)


def test_a_draft_models_prompt_prefill_is_not_taken_for_its_per_token_cost(tiny):
    # Counted, the 0.3 s prefill would price a draft token above a whole verify pass: k = 0 would
    # stick (no more draft calls, so no cheaper measurement to correct it).
    result, verifier = _adaptive_run(
        tiny, lambda target, clock: SlowFirstCall(ModelDrafter(target), clock, 0.3), base_s=0.03
    )
    drafted = [n - 1 for n in verifier.positions[1:-1]]
    assert sum(drafted) / len(drafted) >= 4 and len(verifier.positions) <= 12
