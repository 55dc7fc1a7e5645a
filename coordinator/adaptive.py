"""Adaptive draft length: pick each round's k from the request's observed acceptance and the
measured costs of drafting and verifying (Leviathan et al., "Fast Inference from Transformers
via Speculative Decoding", 2023, section 3).

With per-token acceptance rate α, a round that drafts k tokens commits in expectation

    E[tokens | k] = (1 - α^(k+1)) / (1 - α)

tokens (the accepted prefix plus the target's own token), and costs draft(k) + verify(k + 1).
The round picks the k in [0, k_max] with the most expected tokens per second: where extra
verify positions cost a share of a pass (a CPU), a low α drafts nothing and a high one drafts
long; where they are nearly free (a GPU), even a low α drafts a few.

The costs are the engine's, shared by its requests and learned online from every round: the
target pass's time by the positions it computed for all its rounds (the median of its last
passes, so one stall does not move it), the trip to the target and back, draft time per drafted
token (what pipelining hid costs nothing; a model not measured yet costs a typical c). Rounds of
many requests share a pass, so a round among R prices k by the pass R rounds drafting alike would
make, R (k + 1) positions (`CostModel.verify`): alone that is Leviathan et al.'s verify(k + 1);
at load a draft costs every round in the pass, and only what is accepted often enough is bought.
α is the request's own, an exponentially weighted count of accepted over tested draft positions.

Lookups and model drafts are priced apart. A hybrid draft tier answers a round by prompt lookup
where the context repeats (microseconds, often accepted) and with its model elsewhere (a model
step per token, accepted far less): one α and one cost for both would make k a compromise,
too short where lookups are right and too long where the model is wrong. So α is kept per
source class, draft costs too, and a round asks for the lookup's best k with the model capped
at its own (`draft_lengths`).

`DraftLengthPolicy` is the per-request object the engine asks before each round (`choose`, the
round's `DraftLengths`) and tells after it (`observe`).

When the best k is 0 the request still probes with k = 1 every `probe_every` rounds, so a
request whose text starts to repeat, or a tier whose load drops, gets speculation back; below
its limit it drafts one more than the best as often, so a pass length measured only in a stall
is measured again (verify costs are medians of recent passes: two good ones outvote a stall).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

from specdec.core.acceptance import DraftProposal, PassCost
from specdec.core.draft_source import is_lookup

LOOKUP, MODEL = "lookup", "model"  # the two source classes: prompt lookups and draft models


def source_class(source: str) -> str:
    return LOOKUP if is_lookup(source) else MODEL


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a round commits in expectation with k drafts at per-token acceptance alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class _Curve:
    """Seconds by position count: the median of each count's last `window` samples. A count not
    measured yet follows `shape`, passes timed before serving, scaled to what was measured near
    it (the same pass costs more beside a busy coordinator than alone); without a shape it is
    interpolated between its nearest measured neighbours, or extrapolated from the nearest one
    with `prior_slope` (the share of a one-position pass each extra position adds)."""

    def __init__(self, window: int, prior_slope: float):
        self.window, self.prior_slope = window, prior_slope
        self._samples: dict[int, deque[float]] = {}
        self.seen: dict[int, float] = {}  # per position count: the median of its samples
        self.shape: _Piecewise | None = None  # timed before serving, never decreasing
        self._ratios: _Piecewise | None = None  # measured over timed, per measured count (cached)
        self._measured: _Piecewise | None = None  # through `seen` (cached)
        self._floor: list[float] = []  # _floor[i]: the least seconds measured at the i-th count on (cached)

    def observe(self, positions: int, seconds: float) -> None:
        """Each count's estimate is the median of its last `window` samples: one stalled pass (a
        collection, a first-use kernel setup) among good ones moves it not at all, load that
        lasts shows within a few rounds; with a mean, one stall could price a count so high that
        k never goes there again, so nothing would measure it again."""
        samples = self._samples.setdefault(positions, deque(maxlen=self.window))
        samples.append(seconds)
        self.seen[positions] = statistics.median(samples)
        self._ratios = None
        self._measured = _Piecewise(self.seen)
        self._floor = list(itertools.accumulate(reversed(self._measured.ys), min))[::-1]

    def set_shape(self, points: Mapping[int, float]) -> None:
        self.shape, self._ratios = _Piecewise(points), None

    def at(self, positions: int) -> float:
        """Never above a measured longer count: more positions never cost less, so where a longer
        one measured cheaper, the shorter one's estimate holds a slow pass (timing noise is a
        stall, upwards), and noise must not buy a draft."""
        estimate = self._interpolated(positions)
        if self._measured is None:
            return estimate
        i = bisect.bisect_right(self._measured.xs, positions)
        return min(estimate, self._floor[i]) if i < len(self._floor) else estimate

    def _interpolated(self, positions: int) -> float:
        seen = self.seen
        if positions in seen:
            return seen[positions]
        if self.shape is not None:
            return self.shape.at(positions) * self._scale(positions)
        if not seen:
            return 1.0 + self.prior_slope * (positions - 1)  # no unit yet: only ratios matter, and drafts cost 0 so far
        keys = self._measured.xs
        if keys[0] < positions < keys[-1]:
            return self._measured.at(positions)
        nearest = keys[-1] if positions > keys[-1] else keys[0]
        scale = (1.0 + self.prior_slope * (positions - 1)) / (1.0 + self.prior_slope * (nearest - 1))
        return seen[nearest] * scale

    def _scale(self, positions: int) -> float:
        """Measured over timed, at the measured counts nearest `positions` (interpolated between
        the two around it); 1 while nothing is measured."""
        if not self.seen:
            return 1.0
        if self._ratios is None:
            self._ratios = _Piecewise({n: seconds / self.shape.at(n) for n, seconds in self.seen.items()})
        return self._ratios.at(positions, extend=False)


class _Piecewise:
    """The piecewise-linear curve through `points`."""

    def __init__(self, points: Mapping[int, float]):
        self.xs = sorted(points)
        self.ys = [points[x] for x in self.xs]

    def at(self, x: int, extend: bool = True) -> float:
        """Before the first point, its value; beyond the last, the last segment continued
        (`extend`) or the last value."""
        xs, ys = self.xs, self.ys
        i = bisect.bisect_left(xs, x)
        if i == 0:
            return ys[0]
        if i == len(xs):
            if not extend or len(xs) == 1:
                return ys[-1]
            i -= 1
        lo, hi = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - lo) / (hi - lo)


class CostModel:
    """Seconds per round as the coordinator waits for them: verify(n positions), draft(k).

    A round's verify wait is the pass it joins plus the trip to the target and back. The pass is
    priced by its own curve, seconds by the positions it computed for all its rounds, as the
    target reports each pass (`PassCost`): a round planning k drafts among `rows` rounds prices
    the pass they would make if every one drafted alike, rows x (k + 1) positions, plus the trip
    (the median of recent waits less their pass). So k is the one that maximises the tokens all
    those rounds commit per second of pass: alone, a pass over k + 1 positions; at load, drafts
    that a pass of many rows makes dear are not bought, without a fixed budget to tune per device.
    Until a target reports its passes, rounds are priced by their own waits per position count.
    """

    def __init__(self, weight: float = 0.2, prior_slope: float = 0.1, window: int = 5, model_prior_c: float = 0.1):
        self.weight = weight  # of the newest measurement in each draft cost's mean
        self.prior_slope = prior_slope
        self.model_prior_c = model_prior_c  # a draft model's cost per token, in one-position passes, until measured
        self.window = window  # verify passes kept per position count
        self._rounds = _Curve(window, prior_slope)  # a round's whole verify wait, by its own positions
        self._passes = _Curve(window, prior_slope)  # a target pass, by the positions of all its rounds
        self._trips: deque[float] = deque(maxlen=4 * window)  # a round's wait less its pass
        self._recent_passes: deque[PassCost] = deque(maxlen=8)  # passes counted already (each of its rounds reports it)
        self._draft_per_token: dict[str, float] = {}  # per source class
        # The target runs a session's next plain round ahead of it once two plain rounds came in a
        # row (target_service/lookahead.py): its pass runs while the coordinator is still
        # streaming the last one, so the trip and the pass overlap (`plain`).
        self.plain_ahead = False

    def observe_verify(self, positions: int, seconds: float, cost: PassCost | None = None) -> None:
        """A round's verify wait over its `positions` (k + 1), and the pass that decided it."""
        self._rounds.observe(positions, seconds)
        if cost is not None:
            # A pass of R rounds comes back R times: counted once, so one stalled pass is one
            # sample of the median, not a window of them.
            counted = replace(cost, ahead=False)  # a pass is the same however its round was answered
            if counted not in self._recent_passes:
                self._recent_passes.append(counted)
                self._passes.observe(cost.positions, cost.seconds)
            if not cost.ahead:  # a round answered by a pass run before it was sent waited for none
                self._trips.append(max(0.0, seconds - cost.seconds))

    def seed_passes(self, profile: Mapping[int, float]) -> None:
        """Pass seconds by positions, as the target timed them before serving
        (`TargetVerifier.profile_passes`): until rounds measure a length, the prior slope would
        price it, far above a CPU's nearly flat cost of the first few positions, and drafts would
        grow one position per probe. They give the curve its shape, scaled to the passes measured
        nearest (busy passes cost more than passes alone); made never decreasing, so timing noise
        prices no longer pass below a shorter one."""
        timed = {int(positions): seconds for positions, seconds in profile.items()}
        self._passes.set_shape({n: min(s for m, s in timed.items() if m >= n) for n in timed})

    def observe_draft(self, k: int, seconds: float, source: str = MODEL) -> None:
        """A round's wait for k drafts from a source class (LOOKUP or MODEL)."""
        if k > 0:
            per_token = seconds / k
            old = self._draft_per_token.get(source)
            self._draft_per_token[source] = per_token if old is None else old + self.weight * (per_token - old)

    def verify(self, positions: int, rows: int = 1) -> float:
        """A round over `positions` (k + 1) in a pass of `rows` rounds that draft alike."""
        if not self._priced_by_passes:
            return self._rounds.at(positions)
        return self._trip() + self._passes.at(rows * positions)

    def plain(self, rows: int = 1) -> float:
        """A round without drafts in a pass of `rows` such rounds. Where the target runs plain
        rounds ahead, the coordinator's trip for one round overlaps the pass of the next, so a
        round costs the longer of the two (a CPU pass at load: the pass; a small model or a GPU:
        the trip); else it is any round over one position."""
        if self.plain_ahead and self._priced_by_passes:
            return max(self._passes.at(rows), self._trip())
        return self.verify(1, rows)

    @property
    def _priced_by_passes(self) -> bool:
        """Passes were timed or reported: rounds are priced by the pass they make plus the trip."""
        return bool(self._passes.seen) or self._passes.shape is not None

    def _trip(self) -> float:
        """A round's wait less its pass: the median of recent rounds (0 before any)."""
        return statistics.median(self._trips) if self._trips else 0.0

    def draft(self, k: int, source: str = MODEL) -> float:
        per_token = self._draft_per_token.get(source)
        if per_token is None:
            # Not measured yet: a lookup is free, a model costs `model_prior_c` target steps a
            # token, what a small draft model typically costs. Only a model round after a model
            # round is measured (catch-up excluded), and a hybrid's model rounds seldom follow
            # each other: priced free meanwhile, a model that is seldom right would keep drafting.
            per_token = 0.0 if source == LOOKUP else self.model_prior_c * self.verify(1)
        return per_token * k


@dataclass
class Acceptance:
    """A request's per-token acceptance rate, exponentially weighted over its rounds."""

    decay: float = 0.9
    accepted: float = 1.0  # prior: one accepted of two tested, alpha 0.5 until rounds say otherwise
    tested: float = 2.0

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        # Draft positions the target actually judged: the accepted ones, plus the first rejected.
        tested = accepted + (1 if accepted < proposed else 0)
        self.accepted = self.decay * self.accepted + accepted
        self.tested = self.decay * self.tested + tested

    @property
    def alpha(self) -> float:
        return self.accepted / self.tested if self.tested > 0 else 0.0


@dataclass
class SourcedAcceptance:
    """A request's acceptance per source class."""

    by_class: dict[str, Acceptance] = field(default_factory=lambda: {LOOKUP: Acceptance(), MODEL: Acceptance()})

    def observe(self, source: str, proposed: int, accepted: int) -> None:
        self.by_class[source_class(source)].observe(proposed, accepted)

    def alpha(self, cls: str) -> float:
        return self.by_class[cls].alpha


class DraftLengths(NamedTuple):
    """A round's draft lengths: what the engine asks the draft tier for."""

    k: int  # the round's most drafts
    model_k: int | None  # the most a draft model may propose, when below k; None: k
    why: str = (
        "adaptive"  # what set k: "fixed", "prefill", "adaptive", "probe", "load" or "slo" (the round span's k_policy)
    )


def draft_lengths(
    acceptance: SourcedAcceptance, costs: CostModel, k_max: int, seen: set[str], rows: int = 1
) -> DraftLengths:
    """The round's k from the source classes the draft tier has answered with so far (`seen`):
    one class, its own best k; both (a hybrid), the lookup's best k with the model's as its cap.
    `rows`: the rounds its pass is expected to carry."""
    k_lookup = best_k(acceptance.alpha(LOOKUP), costs, k_max, LOOKUP, rows)
    k_model = best_k(acceptance.alpha(MODEL), costs, k_max, MODEL, rows)
    if seen == {LOOKUP}:
        return DraftLengths(k_lookup, None)
    if seen != {LOOKUP, MODEL}:
        return DraftLengths(k_model, None)  # a model, or nothing seen yet (the priors agree then)
    k = max(k_lookup, k_model)
    return DraftLengths(k, k_model if k_model < k else None)


def best_k(alpha: float, costs: CostModel, k_max: int, source: str = MODEL, rows: int = 1, free: bool = False) -> int:
    """The k in [0, k_max] with the most expected tokens per second of round, in a pass of `rows`
    rounds that draft alike. `free`: drafts take no draft time (what the load alone allows)."""
    best, best_rate = 0, 1.0 / max(costs.plain(rows), 1e-9)
    for k in range(1, k_max + 1):
        draft_s = 0.0 if free else costs.draft(k, source)
        rate = expected_tokens(alpha, k) / max(draft_s + costs.verify(k + 1, rows), 1e-9)
        if rate > best_rate * 1.001:  # a near tie goes to the shorter draft: less waste on a miss
            best, best_rate = k, rate
    return best


def slo_k(costs: CostModel, slo_s: float, k_max: int, rows: int = 1, source: str = MODEL) -> int:
    """The most drafts in [0, k_max] whose round, in a pass of `rows` rounds drafting alike, is
    predicted to take at most `slo_s`: a streamed chunk waits for its round, so the gap between
    chunks stays within the objective. 0 where even a plain round takes longer (drafting less is
    all a round can do then)."""
    k = 0
    while k < k_max and costs.draft(k + 1, source) + costs.verify(k + 2, rows) <= slo_s:
        k += 1
    return k


def ideal_speedup(alpha: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Leviathan et al.'s expected improvement over target-only decoding: tokens per round over
    the round's cost in target steps (c = draft step / target step; verify_ratio = a (k+1)-position
    verify pass over a 1-position one, 1 on hardware where it is free)."""
    return expected_tokens(alpha, k) / (k * cost_ratio + verify_ratio)


class PolicySettings(Protocol):
    """The engine settings the draft-length policy reads (`EngineConfig` has them)."""

    adaptive: bool
    probe_every: int
    speculation_max_running: int
    speculation_token_budget: int
    itl_slo_ms: float


# A request's first round carries its prompt's prefill and drafts nothing: its pass starts at once
# rather than after a proposal over the whole prompt, so the first token reaches the client a
# draft call sooner; under load the draft tier meets every new prompt at once (measured in
# docs/performance.md, "Headline").
PREFILL = DraftLengths(0, None, "prefill")


class DraftLengthPolicy:
    """One request's draft length: `choose` before each round, `observe` after it (the shape of
    transformers' candidate generator with its `update_candidate_strategy`).

    `costs` and `sources` are the engine's, shared by its requests: a cost measured in one request
    prices the next one's rounds, and the source classes the draft tier answers with are the
    tier's, not the request's. The acceptance and the probe counters are the request's own.
    """

    def __init__(self, settings: PolicySettings, costs: CostModel, sources: set[str], *, greedy: bool):
        self.settings = settings
        self.costs = costs
        self.sources = sources
        self.greedy = greedy
        self.acceptance = SourcedAcceptance()
        self.fixed = not settings.adaptive  # a sampled model draft fixes k too: seeded outputs then depend on k only
        self.rounds = 0
        self.rows = 1  # rounds in the pass that decided its last round: the load its next one meets
        # A draft model called after rounds it did not draft (the first one included) is also fed
        # every token committed since: that catch-up is not a drafted token's cost, so a model
        # round's draft time is measured only right after another model round.
        self._model_drafted_last_round = False
        self._since_probe = self._since_probe_up = self._since_model_probe = 0

    def choose(self, cap: int, running: int) -> DraftLengths:
        """This round's lengths, k at most `cap`, with `running` requests generating on the engine."""
        cfg = self.settings
        if cap <= 0 or self.fixed:
            return DraftLengths(max(cap, 0), None, "fixed")
        if cfg.speculation_max_running and running > cfg.speculation_max_running:
            return DraftLengths(0, None, "load")
        budget = cfg.speculation_token_budget
        share = budget // max(running, 1) - 1 if budget > 0 else cap  # this request's positions of a pass, less its own
        if share <= 0:
            return DraftLengths(0, None, "load")
        limit = min(cap, share)
        slo_capped = False
        if cfg.itl_slo_ms > 0:
            within = slo_k(self.costs, cfg.itl_slo_ms / 1000, limit, self.rows, self._draft_class())
            if within == 0:  # no probe either: a probe's longer pass is a gap over the objective
                return DraftLengths(0, None, "slo")
            slo_capped, limit = within < limit, within
        chosen = draft_lengths(self.acceptance, self.costs, limit, self.sources, self.rows)
        self._since_probe = 0 if chosen.k > 0 else self._since_probe + 1
        if chosen.k == 0 and self._since_probe >= cfg.probe_every:
            self._since_probe = 0
            if not self._could_pay(limit):
                return DraftLengths(0, None, "load")
            return DraftLengths(1, None, "probe")
        # One draft more than the best now and then: a length measured once, in a stall, would
        # otherwise never be chosen, so never measured again.
        self._since_probe_up = self._since_probe_up + 1 if 0 < chosen.k < limit else 0
        if self._since_probe_up >= cfg.probe_every:
            self._since_probe_up = 0
            return DraftLengths(chosen.k + 1, chosen.model_k, "probe")
        # A hybrid whose model is capped at 0 still asks it for one token now and then.
        self._since_model_probe = self._since_model_probe + 1 if chosen.model_k == 0 else 0
        if chosen.model_k == 0 and self._since_model_probe >= cfg.probe_every:
            self._since_model_probe = 0
            return DraftLengths(chosen.k, 1, "probe")
        if slo_capped and chosen.k == limit:
            return DraftLengths(chosen.k, chosen.model_k, "slo")
        return DraftLengths(
            chosen.k, chosen.model_k, "load" if self._load_shortened(chosen, limit, share, cap) else "adaptive"
        )

    def _could_pay(self, limit: int) -> bool:
        """Whether drafts accepted every time would pay in a pass of this load: where not, a probe
        measures nothing worth knowing and costs a pass its rows' drafts, and the rounds after it
        their run-ahead (two plain rounds in a row before the target runs the next ahead). The
        load falling makes them pay again, and probing resumes."""
        # Free drafts: a draft tier slow for a while must not stop the probes that measure it again.
        return best_k(1.0, self.costs, limit, rows=self.rows, free=True) > 0

    def _draft_class(self) -> str:
        """The source class whose draft time a round waits for: a lookup where the tier answers
        with lookups only, else a model's (a hybrid's model may run)."""
        return LOOKUP if self.sources == {LOOKUP} else MODEL

    def _load_shortened(self, chosen: DraftLengths, limit: int, share: int, cap: int) -> bool:
        """The load set this k: the budget's share capped it, or alone in a pass it would draft more."""
        if share < cap and chosen.k == share:
            return True
        return self.rows > 1 and chosen.k < draft_lengths(self.acceptance, self.costs, limit, self.sources).k

    def pipelined_model_k(self, model_k: int | None) -> int | None:
        """The model cap of a call made during a verify pass. A hybrid's is a lookup only: its model
        would run beside the target's pass on the same cores, at a cost nothing measures; it
        drafts on demand instead, where the cost model sees it."""
        return 0 if self.sources == {LOOKUP, MODEL} else model_k

    def observe(
        self,
        lengths: DraftLengths,
        proposal: DraftProposal,
        fallback: bool,
        accepted: int,
        draft_s: float,
        verify_s: float,
        cost: PassCost | None = None,
    ) -> None:
        """What the round cost (`cost`: the pass that decided it, when the target reports it)
        and how much of it the target accepted."""
        drafted = len(proposal.token_ids)
        if self.rounds:  # the first round's verify includes the prompt's prefill: not a round's cost
            self.costs.observe_verify(drafted + 1, verify_s, cost)
        if cost is not None:
            self.rows = cost.rows
        self.rounds += 1
        source = source_class(proposal.source)
        answered = lengths.k > 0 and not fallback and (drafted > 0 or proposal.source != "")
        if answered:  # a model that declined every draft answered too
            self.sources.add(source)
        # A model that declined every draft it was allowed (its confidence stop) still ran: for
        # planning that is one draft the target rejected, or a model-only engine keeps asking it.
        declined = int(answered and source == MODEL and drafted == 0 and lengths.model_k != 0)
        if source == LOOKUP or self._model_drafted_last_round:  # lookups have no catch-up to exclude
            self.costs.observe_draft(drafted + declined, draft_s, source)
        self._model_drafted_last_round = answered and source == MODEL
        self.acceptance.observe(proposal.source, drafted + declined, accepted)
        self.fixed |= not self.greedy and proposal.draft_probs is not None
