"""The limit: the speedup Leviathan et al. (2023) predict from the measured acceptance and costs.

With per-position acceptance rates a_1, a_2, ... (a_i: the chance draft i is accepted once the
drafts before it were), a round that drafts k tokens commits on average

    E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k

tokens (Leviathan et al. write it (1 - a^(k+1)) / (1 - a) for one rate a; per-position rates
keep the correlation of prompt-lookup drafts, which are either long runs or nothing). The round
costs k draft steps and one target pass over k + 1 positions, where target-only decoding pays
one single-position pass T1 per token, so the ideal decode speedup over the rounds r of a run is

    ideal = sum_r E(k_r) * T1 / sum_r (k_r * d + V_r)

with d the draft's cost per token and V_r the target pass of round r, both as measured (the
actor's and the draft server's spans); Leviathan et al.'s c is d / T1. Everything the system
adds (the Ray hop, gRPC, the coordinator's work, waiting) is outside the formula, so the
measured decode speedup over the ideal is the system's efficiency. Pipelining can hide draft
time the formula charges, so an efficiency a little above 1 is possible.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from specdec.benchmark.spans import Request, per_position


def position_rates(requests: Sequence[Request]) -> list[float]:
    """[i]: P(draft i+1 accepted | drafts 1..i accepted), over the decode rounds of `requests`:
    position i is judged when every draft before it passed."""
    return per_position((r for request in requests for r in request.decode_rounds), lambda r: min(r.k, r.accepted + 1))


def expected_tokens(k: int, rates: Sequence[float]) -> float:
    """E(k): the mean tokens a k-token round commits (the target's own token included)."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= rates[i] if i < len(rates) else 0.0
        total += reach
    return total


def target_step_ms(baseline: Sequence[Request]) -> float:
    """T1: the median single-position target pass of target-only decoding (prefill excluded)."""
    passes = [
        r.verify_compute_ms for request in baseline for r in request.decode_rounds if r.verify_compute_ms is not None
    ]
    return statistics.median(passes) if passes else 0.0


def draft_ms_per_token(requests: Sequence[Request]) -> float:
    drafted = sum(request.drafted() for request in requests)
    return sum(request.draft_compute_ms for request in requests) / drafted if drafted else 0.0


def ideal_speedup(requests: Sequence[Request], rates: Sequence[float], t1_ms: float, d_ms: float) -> float:
    """The Leviathan ideal over the decode rounds of `requests` (rounds whose pass was not traced
    are left out of both sums)."""
    rounds = [r for request in requests for r in request.decode_rounds if r.verify_compute_ms is not None]
    cost = sum(r.k * d_ms + r.verify_compute_ms for r in rounds)
    return sum(expected_tokens(r.k, rates) for r in rounds) * t1_ms / cost if cost > 0 else 0.0


def efficiency(spec: Sequence[Request], baseline: Sequence[Request]) -> dict[str, float]:
    """Ideal and measured decode speedups of `spec` over `baseline` (target-only) runs of the
    same prompt, and their ratio; with the inputs, so a reader can redo the arithmetic."""
    rates = position_rates(spec)
    t1 = target_step_ms(baseline)
    d = draft_ms_per_token(spec)
    ideal = ideal_speedup(spec, rates, t1, d)
    base = statistics.median(r.decode_tokens_per_s() for r in baseline)
    measured = statistics.median(r.decode_tokens_per_s() for r in spec) / base if base else 0.0
    verify = [
        r.verify_compute_ms
        for request in spec
        for r in request.decode_rounds
        if r.verify_compute_ms is not None and r.k > 0
    ]
    return {
        "ideal_speedup": ideal,
        "measured_decode_speedup": measured,
        "efficiency": measured / ideal if ideal else 0.0,
        "alpha_by_position": rates,
        "t1_ms": t1,
        "draft_ms_per_token": d,
        "c": d / t1 if t1 else 0.0,
        "verify_ms_median": statistics.median(verify) if verify else 0.0,
        "mean_k": statistics.mean(r.k for request in spec for r in request.decode_rounds) if spec else 0.0,
    }
