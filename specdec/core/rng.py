"""Randomness keyed by (seed, position, stream), drawn on whatever device holds the probabilities.

Every random draw of a request is a pure function of its seed and the absolute position of the
token it decides, never of a generator's running state. So a seeded request gives the same text
whatever batch it shared, whichever replica served it, and however its rounds were cut (k).
Streams keep the draws for different purposes independent at the same position.

A draw is an inversion of the cumulative distribution at a uniform u that is a counter-based hash
of the key (MurmurHash3's 32-bit finalizer), computed with integer tensor ops on the
probabilities' own device: no generator object, no host round trip, one kernel sequence for
every row of a pass, and the same u on a CPU and a GPU. Every product is kept below 2^63 so
int64 arithmetic never overflows.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

import torch

_MASK64 = (1 << 64) - 1
_MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B1
_FMIX = (0x85EBCA6B, 0xC2B2AE35)


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
    """A 64-bit key that depends on all three inputs."""
    return _splitmix64(_splitmix64(_splitmix64(seed) ^ position) ^ int(stream))


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for 0 <= x < 2^32, in pieces whose products stay below 2^63."""
    low, high = c & 0xFFFF, c >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, _FMIX[0])
    h = h ^ (h >> 13)
    h = _mul32(h, _FMIX[1])
    return h ^ (h >> 16)


def uniforms(keys: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """(len(keys),) float64 uniforms in (0, 1) with 53 random bits: one per key. On the host the
    same hash runs on Python ints (a few rows: cheaper than a dozen tensor ops each)."""
    if torch.device(device).type == "cpu":
        return torch.tensor([_uniform_int(k) for k in keys], dtype=torch.float64)
    return _uniforms_tensor(keys, device)


def _uniforms_tensor(keys: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """`uniforms` with tensor ops on `device`: the same bits as on the host."""
    halves = torch.tensor([[k & _MASK32, (k >> 32) & _MASK32] for k in keys], dtype=torch.int64).to(device)
    high = _fmix32(_fmix32(halves[:, 0] ^ _GOLDEN32) ^ halves[:, 1])
    low = _fmix32(high ^ halves[:, 0])
    bits = ((high >> 5) << 26) | (low >> 6)  # 27 + 26 bits
    return (bits.double() + 0.5) * 2.0**-53


def _uniform_int(k: int) -> float:
    """`uniforms` for one key on Python ints: the same bits as the tensor path."""
    k_low, k_high = k & _MASK32, (k >> 32) & _MASK32
    high = _fmix32_int(_fmix32_int(k_low ^ _GOLDEN32) ^ k_high)
    low = _fmix32_int(high ^ k_low)
    return ((((high >> 5) << 26) | (low >> 6)) + 0.5) * 2.0**-53


def _fmix32_int(h: int) -> int:
    h ^= h >> 16
    h = (h * _FMIX[0]) & _MASK32
    h ^= h >> 13
    h = (h * _FMIX[1]) & _MASK32
    return h ^ (h >> 16)


def draw(probs: torch.Tensor, keys: Sequence[int]) -> torch.Tensor:
    """One draw per row of `probs` (rows, vocab) by inversion: the first token whose cumulative
    mass exceeds u * total, u keyed. With fixed u the token is a deterministic function of
    (probs, key), which is what makes seeded output independent of batching and k. Zero-mass
    tokens are never drawn; rows need not be normalized. Returns (rows,) token ids on the
    probabilities' device, with no host sync: one uniform per row, not one per vocab entry.
    """
    return invert(probs, uniforms(keys, probs.device))


def invert(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`draw` with the uniforms (rows,) given."""
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # (rows, vocab)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    token = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return token.clamp_max_(probs.shape[-1] - 1)  # u * total rounded up to the last bound


def uniform(seed: int, position: int, stream: Stream = Stream.ACCEPT) -> float:
    return float(uniforms([key(seed, position, stream)])[0])


def sample(probs: torch.Tensor, seed: int, position: int, stream: Stream) -> int:
    """One draw from `probs` (vocab,), on the host: `draw` for a single row."""
    return int(draw(probs.reshape(1, -1), [key(seed, position, stream)])[0])
