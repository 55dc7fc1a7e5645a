"""What crosses the Ray boundary between the pool (coordinator side) and a target actor.

A round names what the actor should already hold (`committed_len` tokens of the session) and
only the tokens after it, so steady-state rounds ship a handful of ids, not the whole context.
An actor that does not hold that prefix (new replica, restart, eviction) answers `miss`, and the
pool resends the full context once: the coordinator's token list is the only authority.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.core.acceptance import Verification
from specdec.core.sampling import SamplingParams


@dataclass
class VerifyRequest:
    session_id: str
    committed_len: int  # tokens of the session the actor should already hold
    new_tokens: list[int]  # committed tokens after those
    draft_ids: list[int]  # x_1..x_k, possibly none
    draft_probs: torch.Tensor | None  # (k, vocab) q, only for sampled model drafts
    sampling: SamplingParams
    trace_carrier: dict[str, str] = field(default_factory=dict)  # W3C traceparent of the round
    draft_parents: list[int] | None = None  # a token tree's parent indices (specdec.core.tree); None: a chain


@dataclass
class VerifyReply:
    verification: Verification | None  # None when `miss`
    miss: bool = False  # the actor lacks the session or its committed prefix: resend everything
    held: int = 0  # tokens of the session the actor holds after this round
    error: str = ""  # a request the actor refuses (beyond the model's context): never retried
    overloaded: bool = False  # the actor's queue is full: place the session elsewhere
