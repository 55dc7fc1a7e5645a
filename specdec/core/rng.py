"""Randomness keyed by (seed, position, stream).

Every random draw of a request is a pure function of its seed and the absolute position of the
token it decides, never of a generator's running state. So a seeded request gives the same text
whatever batch it shared, whichever replica served it, and however its rounds were cut (k).
Streams keep the draws for different purposes independent at the same position.
"""

from __future__ import annotations

from enum import IntEnum

import torch

_MASK64 = (1 << 64) - 1


class Stream(IntEnum):
    TARGET = 1  # target-side samples: plain decoding, bonus tokens, residual draws
    ACCEPT = 2  # the uniform of the acceptance test min(1, p/q)
    DRAFT = 3  # the draft model's own samples from q


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def key(seed: int, position: int, stream: Stream) -> int:
    """A 63-bit generator seed that depends on all three inputs (torch seeds are signed 64-bit)."""
    return _splitmix64(_splitmix64(_splitmix64(seed) ^ position) ^ int(stream)) >> 1


def _generator(seed: int, position: int, stream: Stream) -> torch.Generator:
    return torch.Generator().manual_seed(key(seed, position, stream))


def uniform(seed: int, position: int, stream: Stream = Stream.ACCEPT) -> float:
    return torch.rand((), generator=_generator(seed, position, stream)).item()


def sample(probs: torch.Tensor, seed: int, position: int, stream: Stream) -> int:
    """One draw from `probs` (vocab,) by the exponential race: argmax(p_i / E_i), E_i ~ Exp(1).

    Equivalent to the Gumbel-max trick; with fixed noise the winner is a deterministic function
    of (probs, seed, position), which is what makes seeded output independent of batching and k.
    """
    noise = torch.empty(probs.shape[-1]).exponential_(generator=_generator(seed, position, stream))
    noise.clamp_min_(torch.finfo(torch.float32).tiny)  # a zero draw would turn 0/0 into NaN
    return int(torch.argmax(probs.float() / noise))
