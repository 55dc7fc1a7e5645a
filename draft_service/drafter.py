"""The draft tier's one contract: what every drafter (n-gram, suffix, model, hybrid) offers.

In the spirit of transformers' CandidateGenerator: `propose` a round's drafts, `observe` a
finished request's output (what a drafter that learns across requests keeps), `end` a session,
and `capabilities`, what a caller may expect of the proposals. The draft service (service.py) and
the in-process engine (specdec/local/in_process.py) reach drafters only through it; which
drafter a configuration names is decided in one place, registry.py.

`propose` is async because a draft model's rounds wait for its batched step (the service's
queue, or one worker thread in process); lookups answer at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams


@dataclass(frozen=True)
class Capabilities:
    trees: bool = False  # answers `tree` requests with token trees (parents before children); else chains
    draft_probs: bool = False  # sampled model rounds carry q; lookup rounds are point masses
    model: bool = False  # runs a draft model: its rounds wait for the model's batched step
    learns: bool = False  # `observe` learns from completions, so their token ids must be valid


@dataclass
class DraftRequest:
    session_id: str
    tokens: Sequence[int]  # the whole committed sequence
    k: int  # draft tokens wanted (nodes, for a tree)
    sampling: SamplingParams
    # Most tokens a draft model may propose (lookups keep k); None: k. A draft model's own step is
    # only ever handed requests already capped.
    model_k: int | None = None
    tree: bool = False  # a token tree of up to k nodes is welcome (drafters with `capabilities.trees`)
    deadline: float | None = None  # on the service's clock: a model round not started by then is dropped


@dataclass
class Drafted:
    proposal: DraftProposal
    found_in: str = ""  # where a suffix lookup found its draft: "context", "cache", "none"; "" when none ran


@dataclass(frozen=True)
class Learned:
    """What a learning drafter keeps from completions, after an `observe`."""

    tokens: int
    nbytes: int


class Drafter(Protocol):
    capabilities: Capabilities

    async def propose(self, request: DraftRequest) -> Drafted:
        """At most `request.k` draft tokens to follow `request.tokens`, drawn under its sampling;
        the proposal names its source (`DraftSource`). Fewer, or none, is a valid proposal."""

    def observe(self, session_id: str, completion: Sequence[int]) -> Learned | None:
        """The session's request finished with `completion` (its output, prompt excluded): a
        drafter that learns across requests keeps it (and says what it now holds), others return None."""

    def end(self, session_id: str) -> None:
        """Forget what the drafter holds for the session; unknown ids are fine."""


# A draft model's batched step for one request: the service's queue, or a worker thread in process.
ModelStep = Callable[[DraftRequest], Awaitable[DraftProposal]]
