"""Logits warping shared by draft and target.

Both sides call `warp` with the request's `SamplingParams`, so q and p are shaped by exactly the
same rule (HF order: temperature, then top-k, then top-p). That is what keeps the speculative
sampler exact under top-k/top-p: it matches the *warped* target distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.core.errors import InvalidArgument

# Below this, logits / temperature overflows float32 (to inf, then NaN probabilities: measured, a
# temperature of 1e-38 gives token 0 at every step); vLLM draws its greedy line at the same 1e-5.
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax of the raw logits)
    top_p: float = 1.0  # nucleus mass kept; 0 means 1 (off), as on the wire
    top_k: int = 0  # keep the k most likely tokens; 0 means off
    seed: int | None = None  # keys every random draw; None lets the engine draw one

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, prefix: str = "sampling") -> None:
        t, p = self.temperature, self.top_p
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0 or 0 < t < MIN_TEMPERATURE:
            raise InvalidArgument(
                f"{prefix}.temperature", f"must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got {t!r}"
            )
        if not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 <= p <= 1.0:
            raise InvalidArgument(f"{prefix}.top_p", f"must be in [0, 1], got {p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidArgument(f"{prefix}.top_k", f"must be an integer >= 0, got {self.top_k!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**64):
            raise InvalidArgument(f"{prefix}.seed", f"must be an integer in [0, 2^64), got {self.seed!r}")


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Sampling distribution for each row of `logits` (..., vocab) -> probs (..., vocab), fp32.

    Not for greedy requests: greedy verification compares argmaxes and never builds probabilities.
    """
    assert not params.greedy, "warp is for sampled requests; greedy uses argmax"
    scores = logits.float() / params.temperature  # (..., vocab)
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # (..., 1)
        scores = scores.masked_fill(scores < kth, -math.inf)
    probs = torch.softmax(scores, dim=-1)
    if 0.0 < params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        # Drop a token when the mass strictly before it already reaches top_p: the kept set is the
        # smallest prefix whose mass is >= top_p, and the most likely token always survives.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
