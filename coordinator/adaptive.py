"""Adaptive draft length: pick each round's k from the request's observed acceptance and the
measured costs of drafting and verifying (Leviathan et al., "Fast Inference from Transformers
via Speculative Decoding", 2023, section 3).

With per-token acceptance rate α, a round that drafts k tokens commits in expectation

    E[tokens | k] = (1 - α^(k+1)) / (1 - α)

tokens (the accepted prefix plus the target's own token), and costs draft(k) + verify(k + 1).
The round picks the k in [0, k_max] with the most expected tokens per second. On this CPU a
verify pass over 9 positions costs about 2.2 single steps, so with α = 0.24 (the n-gram
drafter on free text) every k above 0 loses, while with α = 0.9 (copying) k = 8 wins.

The costs are the engine's, shared by its requests and learned online from every round: verify
time per number of positions (exponentially weighted, so load on the target tier shows up within
a few rounds), draft time per drafted token (what pipelining hid costs nothing). α is the request's own, an
exponentially weighted count of accepted over tested draft positions.

When the best k is 0 the request still probes with k = 1 every `probe_every` rounds, so a
request whose text starts to repeat, or a tier whose load drops, gets speculation back.
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a round commits in expectation with k drafts at per-token acceptance alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class CostModel:
    """Seconds per round as the coordinator waits for them: verify(n positions), draft(k).

    Verify time is kept per position count n (an exponentially weighted mean each); a count not
    seen yet is interpolated between its nearest seen neighbours, or extrapolated from the
    nearest one with `prior_slope` (the share of a one-position pass each extra position adds:
    about 0.16 on this CPU, near 0 on a GPU) until rounds of that length have been measured.
    """

    def __init__(self, weight: float = 0.2, prior_slope: float = 0.1):
        self.weight = weight  # of the newest measurement in each mean
        self.prior_slope = prior_slope
        self._verify: dict[int, float] = {}
        self._draft_per_token: float | None = None

    def observe_verify(self, positions: int, seconds: float) -> None:
        old = self._verify.get(positions)
        self._verify[positions] = seconds if old is None else old + self.weight * (seconds - old)

    def observe_draft(self, k: int, seconds: float) -> None:
        if k > 0:
            per_token = seconds / k
            old = self._draft_per_token
            self._draft_per_token = per_token if old is None else old + self.weight * (per_token - old)

    def verify(self, positions: int) -> float:
        seen = self._verify
        if positions in seen:
            return seen[positions]
        if not seen:
            return 1.0 + self.prior_slope * (positions - 1)  # no unit yet: only ratios matter, and drafts cost 0 so far
        below = [n for n in seen if n < positions]
        above = [n for n in seen if n > positions]
        if below and above:
            lo, hi = max(below), min(above)
            return seen[lo] + (seen[hi] - seen[lo]) * (positions - lo) / (hi - lo)
        nearest = max(below) if below else min(above)
        scale = (1.0 + self.prior_slope * (positions - 1)) / (1.0 + self.prior_slope * (nearest - 1))
        return seen[nearest] * scale

    def draft(self, k: int) -> float:
        return (self._draft_per_token or 0.0) * k


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


def best_k(alpha: float, costs: CostModel, k_max: int) -> int:
    """The k in [0, k_max] with the most expected tokens per second of round."""
    best, best_rate = 0, 0.0
    for k in range(k_max + 1):
        rate = expected_tokens(alpha, k) / (costs.draft(k) + costs.verify(k + 1))
        if rate > best_rate * 1.001:  # a near tie goes to the shorter draft: less waste on a miss
            best, best_rate = k, rate
    return best


def ideal_speedup(alpha: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Leviathan et al.'s expected improvement over target-only decoding: tokens per round over
    the round's cost in target steps (c = draft step / target step; verify_ratio = a (k+1)-position
    verify pass over a 1-position one, 1 on hardware where it is free)."""
    return expected_tokens(alpha, k) / (k * cost_ratio + verify_ratio)
