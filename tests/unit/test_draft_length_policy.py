"""The draft-length policy alone: a plan before each round, an observation after it, no engine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from specdec.coordinator.adaptive import LOOKUP, MODEL, Acceptance, CostModel, DraftLengthPolicy, DraftLengths
from specdec.core.acceptance import DraftProposal, PassCost


@dataclass
class Settings:
    adaptive: bool = True
    probe_every: int = 4
    speculation_max_running: int = 0
    speculation_token_budget: int = 0
    itl_slo_ms: float = 0.0


def costs(per_position: float = 0.016) -> CostModel:
    """A CPU-like target: 100 ms a pass, +16% of it per extra position; lookups free."""
    model = CostModel()
    for n in range(1, 10):
        model.observe_verify(n, 0.1 + per_position * (n - 1))
    return model


def pass_s(drafts: int) -> float:
    return 0.1 + 0.016 * drafts  # the target of `costs()`


def rejected(policy: DraftLengthPolicy, planned: DraftLengths, source: str = "ngram") -> None:
    proposal = DraftProposal([1] * planned.k, source=source)
    policy.observe(planned, proposal, False, 0, draft_s=0.0, verify_s=pass_s(planned.k))


def test_fixed_and_load_plans():
    assert DraftLengthPolicy(Settings(adaptive=False), costs(), set(), greedy=True).choose(5, 1) == (5, None, "fixed")
    assert DraftLengthPolicy(Settings(), costs(), set(), greedy=True).choose(0, 1) == (0, None, "fixed")
    busy = DraftLengthPolicy(Settings(speculation_max_running=2), costs(), set(), greedy=True)
    assert busy.choose(8, 3) == (0, None, "load") and busy.choose(8, 2).k > 0
    budget = DraftLengthPolicy(Settings(speculation_token_budget=8), costs(0.0), set(), greedy=True)
    assert budget.choose(8, 4) == (1, None, "load")  # 8 // 4 - 1: one draft beside its own position
    assert budget.choose(8, 8) == (0, None, "load")


def test_rejected_drafts_stop_then_probe_every_few_rounds():
    policy = DraftLengthPolicy(Settings(), costs(), set(), greedy=True)
    ks = []
    for _ in range(24):
        planned = policy.choose(8, 1)
        ks.append(planned.k)
        rejected(policy, planned)
    assert ks[0] > 0  # the prior (alpha 0.5) drafts
    later = ks[12:]
    assert later.count(1) == len(later) // 4 and set(later) <= {0, 1}, ks  # k = 0, a 1-token probe every 4th


def test_accepted_lookups_draft_long_and_a_rejected_model_is_capped():
    shared_sources: set[str] = set()
    policy = DraftLengthPolicy(Settings(), costs(), shared_sources, greedy=True)
    for i in range(40):
        planned = policy.choose(8, 1)
        source = "ngram" if i % 2 else "model"
        drafted = planned.k if source == "ngram" else min(planned.k, planned.model_k or planned.k)
        accepted = drafted if source == "ngram" else 0
        proposal = DraftProposal([1] * drafted, source=source)
        policy.observe(planned, proposal, False, accepted, draft_s=0.001 * drafted, verify_s=pass_s(drafted))
    assert shared_sources == {LOOKUP, MODEL}  # the engine's set, filled by the request's rounds
    final = policy.choose(8, 1)
    assert final.k >= 4 and final.model_k in (0, 1)  # lookups draft long; the model at 0, or its probe
    assert policy.pipelined_model_k(final.model_k) == 0  # a hybrid's pipelined call is a lookup only


def test_the_first_verify_is_prefill_not_a_round_cost():
    model = CostModel()
    policy = DraftLengthPolicy(Settings(), model, set(), greedy=True)
    planned = policy.choose(4, 1)
    policy.observe(planned, DraftProposal([], source=""), False, 0, draft_s=0.0, verify_s=5.0)
    assert model.verify(1) == 1.0  # still the prior: the prompt's prefill priced nothing
    policy.observe(planned, DraftProposal([], source=""), False, 0, draft_s=0.0, verify_s=0.2)
    assert model.verify(1) == 0.2


def test_a_sampled_model_draft_fixes_k():
    policy = DraftLengthPolicy(Settings(), costs(), set(), greedy=False)
    planned = policy.choose(6, 1)
    q = torch.full((planned.k, 8), 1 / 8)
    policy.observe(planned, DraftProposal([1] * planned.k, q, "model"), False, 0, draft_s=0.0, verify_s=0.1)
    assert policy.choose(6, 1) == (6, None, "fixed")  # seeded outputs then depend on k only


def cpu_pass_s(positions: int) -> float:
    """A CPU-like target pass: 20 ms, and 1.5 ms more a position (the latest profile's shape)."""
    return 0.02 + 0.0015 * positions


def measured_passes(trip_s: float = 0.004) -> CostModel:
    model = CostModel()
    for positions in range(1, 160):
        model.observe_verify(1, cpu_pass_s(positions) + trip_s, PassCost(1, positions, cpu_pass_s(positions)))
    return model


def test_a_pass_carrying_many_rounds_prices_their_drafts_together():
    model = measured_passes()
    # The trip (wait less pass) is 4 ms; a round of k + 1 positions among 16 alike makes 16 (k + 1).
    assert model.verify(3, rows=16) == pytest.approx(0.004 + cpu_pass_s(48))
    assert model.verify(3) == pytest.approx(0.004 + cpu_pass_s(3))
    # Rounds answered by a pass run ahead of them waited less than the pass: no trip to learn.
    for _ in range(100):
        model.observe_verify(1, 0.0, PassCost(16, 16, cpu_pass_s(16), ahead=True))
    assert model.verify(1) == pytest.approx(0.004 + cpu_pass_s(1))


def test_drafts_shrink_as_the_pass_fills_and_come_back_when_it_empties():
    policy = DraftLengthPolicy(Settings(), measured_passes(), set(), greedy=True)
    policy.acceptance.by_class[LOOKUP] = Acceptance(accepted=8.0, tested=10.0)  # alpha 0.8
    policy.sources.add(LOOKUP)
    # Alone, a pass is mostly its fixed cost: drafts are nearly free. Among 16 rounds drafting
    # alike, each draft adds 16 positions at 1.5 ms: k = 2 has the most tokens per second.
    assert policy.choose(8, 1).k >= 7
    policy.rows = 16
    assert policy.choose(8, 16) == (2, None, "load")  # the load shortened it: traced as such
    policy.rows = 1
    assert policy.choose(8, 1).k >= 7


def test_at_load_the_prior_alpha_drafts_nothing():
    costs_ = CostModel()
    for positions in range(16, 160, 16):
        costs_.observe_verify(1, cpu_pass_s(positions), PassCost(16, positions, cpu_pass_s(positions)))
    policy = DraftLengthPolicy(Settings(), costs_, set(), greedy=True)
    policy.rows = 16
    assert policy.choose(8, 16).k == 0  # alpha 0.5: a draft costs 16 positions for 0.5 of a token each


def test_a_pass_is_one_sample_however_many_of_its_rounds_report_it():
    model = measured_passes()
    for jitter in (0.0001, 0.0002):  # two more passes over 48 positions
        model.observe_verify(3, cpu_pass_s(48) + jitter, PassCost(16, 48, cpu_pass_s(48) + jitter))
    stalled = PassCost(16, 48, 10 * cpu_pass_s(48))
    for _ in range(16):  # its 16 rounds each bring it back
        model.observe_verify(3, stalled.seconds, stalled)
    assert model.verify(3, rows=16) < 2 * cpu_pass_s(48)  # the median of 4 passes, one of them stalled


def test_passes_timed_before_serving_let_the_first_rounds_draft_long():
    """A CPU pass costs nearly the same from 1 to 9 positions: priced by the prior slope instead,
    the first requests draft short and lengthen by one position per probe."""
    timed = {1: 0.0226, 2: 0.0228, 3: 0.0243, 5: 0.0239, 9: 0.0265, 17: 0.0335, 32: 0.048}  # this CPU's
    seeded = CostModel()
    seeded.seed_passes(timed)
    # A lookup drafter (the default suffix decoding), alpha still the prior 0.5.
    k_seeded = DraftLengthPolicy(Settings(), seeded, {LOOKUP}, greedy=True).choose(8, 1).k
    k_guessed = DraftLengthPolicy(Settings(), costs_after_one_round(), {LOOKUP}, greedy=True).choose(8, 1).k
    assert k_seeded >= 4 and k_guessed <= 2, (k_seeded, k_guessed)


def costs_after_one_round() -> CostModel:
    """What an unseeded model knows after one measured round of 3 positions on that CPU."""
    model = CostModel()
    model.observe_verify(3, 0.0243, PassCost(1, 3, 0.0243))
    return model


def test_passes_measured_at_load_rescale_the_ones_timed_alone():
    """A pass beside a busy coordinator costs more than the same pass timed alone: the timed
    curve keeps its shape, scaled by what was measured nearest, and a stale timed figure never
    prices a shorter pass below its measured cost."""
    model = CostModel()
    model.seed_passes({1: 0.02, 16: 0.04, 64: 0.1, 128: 0.18})
    assert model.verify(64) == pytest.approx(0.1)  # nothing measured yet: the timed pass
    model.observe_verify(1, 0.052, PassCost(16, 16, 0.052))  # 1.3x the timed pass, no trip
    assert model.verify(4, rows=16) == pytest.approx(1.3 * 0.1)  # 64 positions, at the measured scale
    assert model.verify(16) == pytest.approx(0.052)
    assert model.verify(8, rows=32) == pytest.approx(1.3 * (0.18 + 0.08 * (256 - 128) / 64))  # past the last timed


def test_an_itl_objective_caps_drafts_at_the_pass_it_predicts_within_it():
    lookups = {LOOKUP}
    free = DraftLengthPolicy(Settings(), measured_passes(), lookups, greedy=True)
    free.acceptance.by_class[LOOKUP] = Acceptance(accepted=9.5, tested=10.0)  # alpha 0.95: long drafts pay
    free.rows = 16
    unbounded = free.choose(8, 16).k
    # Among 16 rounds drafting alike, k drafts make a pass of 16 (k + 1) positions: 3 of them
    # (64 positions) fit a 4 + 20 + 96 = 120 ms objective, 4 (80 positions) do not.
    slo_ms = 1000 * (0.004 + cpu_pass_s(64)) + 0.1
    bounded = DraftLengthPolicy(Settings(itl_slo_ms=slo_ms), measured_passes(), lookups, greedy=True)
    bounded.acceptance = free.acceptance
    bounded.rows = 16
    assert unbounded > 3 and bounded.choose(8, 16) == (3, None, "slo")
    # Alone in a pass, the same objective holds every draft the acceptance buys.
    bounded.rows = 1
    free.rows = 1
    assert bounded.choose(8, 1).k == free.choose(8, 1).k > 3


def test_an_itl_objective_below_a_plain_pass_stops_drafts_and_probes():
    policy = DraftLengthPolicy(Settings(itl_slo_ms=10.0), measured_passes(), {LOOKUP}, greedy=True)
    plans = []
    for _ in range(3 * Settings.probe_every):
        planned = policy.choose(8, 1)
        plans.append(planned)
        rejected(policy, planned)
    # A plain round (24 ms) is over the objective already: a probe's longer pass would only add.
    assert set(plans) == {DraftLengths(0, None, "slo")}


def test_a_plain_round_run_ahead_overlaps_its_trip():
    # A trip of 40 ms beside passes of 44 ms (16 positions) to 92 ms (48): with the trip added to
    # every round, one or two drafts at alpha 0.6 beat none; where the target runs plain rounds
    # ahead, a round without drafts costs the longer of its pass and the trip (here its pass),
    # and drafting no longer pays.
    policy = DraftLengthPolicy(Settings(), measured_passes(trip_s=0.04), {LOOKUP}, greedy=True)
    policy.acceptance.by_class[LOOKUP] = Acceptance(accepted=6.0, tested=10.0)
    policy.rows = 16
    assert policy.choose(8, 16).k > 0
    policy.costs.plain_ahead = True
    assert policy.choose(8, 16).k == 0


def flat_then_linear_passes() -> CostModel:
    """Passes of up to 64 positions cost 100 ms alike, longer ones grow with their positions."""
    model = CostModel()
    for positions in range(1, 600):
        seconds = max(0.1, 0.1 * positions / 64)
        model.observe_verify(1, seconds + 0.004, PassCost(1, positions, seconds))
    model.plain_ahead = True
    return model


def test_no_probe_where_drafts_accepted_every_time_would_not_pay():
    policy = DraftLengthPolicy(Settings(), flat_then_linear_passes(), set(), greedy=True)
    policy.rows = 64  # a draft adds 64 positions to a pass already past its flat part
    plans = []
    for _ in range(12):
        plans.append(policy.choose(8, 64))
        rejected(policy, plans[-1])
    assert {p.k for p in plans} == {0} and "probe" not in {p.why for p in plans}, plans
    policy.rows = 1  # the load fell: a draft is nearly free again
    assert policy.choose(8, 1).k > 0


def test_a_slow_draft_tier_is_still_probed():
    # Drafts that took 2 s each price every k above 0 out, but the load would let free drafts pay:
    # the probes go on, so a draft tier that recovers is measured again.
    policy = DraftLengthPolicy(Settings(), costs(), {MODEL}, greedy=True)
    policy.costs.observe_draft(1, 2.0, MODEL)
    plans = [policy.choose(8, 1) for _ in range(8)]
    assert [p.k for p in plans[:3]] == [0, 0, 0] and plans[3] == (1, None, "probe"), plans
