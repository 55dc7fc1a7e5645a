"""The round overhead outside the pass, calibrated from closed-loop tokens/s the stack measured.

At each calibration level the overhead is the one with which the planner's closed loop of that
many streams gives the measured tokens/s; a line through two levels is o + o_r·streams, o_r being
each stream's share of the host, which serializes with the pass on shared cores.
"""

from __future__ import annotations

import dataclasses
import statistics

from specdec.plan.capacity import Costs, closed_loop_tokens_per_s


def overhead_for(costs: Costs, streams: int, tokens_per_s: float, prompt_tokens: int, output_tokens: int) -> float:
    """The round overhead (ms, the same at every stream count) with which the planner's closed
    loop of `streams` gives `tokens_per_s`: bisection, since more overhead is fewer tokens."""
    low, high = 0.0, 60_000.0
    for _ in range(60):
        mid = (low + high) / 2
        trial = dataclasses.replace(costs, round_overhead_ms=mid, round_overhead_per_row_ms=0.0)
        if closed_loop_tokens_per_s(trial, streams, prompt_tokens, output_tokens, 0.0, 0) > tokens_per_s:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def overhead_line(
    costs: Costs, measured: dict[int, float], prompt_tokens: int, output_tokens: int
) -> tuple[float, float, dict[int, float]]:
    """(o, o_r, the overhead at each level) from two levels' measured tokens/s."""
    at = {n: overhead_for(costs, n, tokens_per_s, prompt_tokens, output_tokens) for n, tokens_per_s in measured.items()}
    (n1, o1), (n2, o2) = sorted(at.items())
    per_row = max(0.0, (o2 - o1) / (n2 - n1))
    fixed = max(0.0, statistics.mean(o - per_row * n for n, o in at.items()))
    return fixed, per_row, at
