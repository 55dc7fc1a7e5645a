"""The draft side of one request: the Proposer interface, fallback to plain decoding, and
pipelining.

Fallback: a proposer that errors or answers later than `draft_timeout_s` costs one round without
speculation (k = 0), not the request; speculation is retried `draft_retry_s` later, so a draft
tier that comes back is used again. The tokens never change: k = 0 goes through the same
verifier, and every draw is keyed by position.

Pipelining (docs/design.md, "Drafting, pipelining, load"): each proposal asks for one token more than
the round drafts. While the round is verified, the next round's proposal is requested for the
context that full acceptance would give, with that extra token as the guess of the target's
bonus. If verification agrees, the next round starts with its drafts ready; if not, the
speculative call is cancelled and the drafter's cache rolls back on the next call.

A hybrid draft tier answers some rounds by prompt lookup and others with its model, and the two
are priced apart (coordinator/adaptive.py): `model_k` caps what the model may draft in a round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from specdec.core.acceptance import DraftProposal
from specdec.core.draft_source import is_lookup, model_draft_limit
from specdec.core.sampling import SamplingParams

log = logging.getLogger(__name__)


class Proposer(Protocol):
    """The draft tier as the engine sees it: `DraftClient` (gRPC) and the in-process adapters
    (specdec/local/in_process.py) implement it."""

    async def propose(
        self,
        session_id: str,
        tokens: Sequence[int],
        k: int,
        sampling: SamplingParams,
        model_k: int | None = None,
        affinity: str = "",
        tree: bool = False,
    ) -> DraftProposal:
        """At most k draft tokens to follow `tokens` (the whole committed sequence), drawn under
        `sampling`. The proposal names its source (`DraftSource`).

        - `model_k`: a draft model among the proposer's drafters proposes at most this many
          (None: k; 0: lookups only).
        - `affinity`: the request's cache-affinity key; a proposer over several replicas sends
          every request with one key to one replica ("": placed by session id).
        - `tree`: the answer may be a token tree of up to k nodes (parents before children); a
          proposer that drafts chains ignores it. The engine sets it only with `token_tree` on.

        Every implementation, test fakes included, takes all seven: `DraftSide` passes them all."""

    async def end_session(self, session_id: str, completion: Sequence[int] = ()) -> None:
        """Free what the proposer holds for the session; unknown ids are fine. `completion` is the
        request's output (prompt excluded), which a suffix drafter learns from."""


class Drafts(NamedTuple):
    proposal: DraftProposal
    guess: int | None  # the drafter's guess of the token after the drafts (pipelining), or None
    fallback: bool = False  # no drafts because the draft tier failed, was too slow, or is being retried


@dataclass(frozen=True)
class PipelinedCall:
    """A proposal asked for during the previous round's verification, for the context that round
    gives if every draft and the guessed bonus are accepted."""

    context: tuple[int, ...]  # the tokens it drafts after: it serves a round that starts from exactly these
    k: int  # drafts asked for: it serves a round of at most k (a prefix is a draft too)
    model_k: int | None  # its cap on a draft model's drafts (0: a lookup only)
    task: asyncio.Task[Drafts]


class DraftSide:
    def __init__(
        self,
        proposer: Proposer,
        session_id: str,
        sampling: SamplingParams,
        *,
        pipeline: bool,
        timeout_s: float,
        retry_s: float,
        clock: Callable[[], float] = time.monotonic,
        affinity: str = "",
        tree: bool = False,
    ):
        self.proposer = proposer
        self.session_id = session_id
        self.sampling = sampling
        self.pipeline = pipeline
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.clock = clock  # seconds, for the retry delay
        self.affinity = affinity  # the request's cache-affinity key ("": none)
        self.tree = tree  # ask for token trees of up to k nodes
        self.failures = 0  # proposer errors and timeouts
        self.pipelined_hits = 0  # rounds whose drafts were ready when verification ended
        self._retry_at = 0.0
        self._next: PipelinedCall | None = None

    async def propose(self, tokens: Sequence[int], k: int, model_k: int | None = None) -> Drafts:
        """This round's drafts (at most k; at most model_k when a draft model answers) and, when
        pipelining, the drafter's guess of the token after them."""
        if k <= 0:
            await self.cancel_pipelined()
            return Drafts(DraftProposal([]), None)
        ready = self._next
        self._next = None
        if ready is not None and ready.context == tuple(tokens) and ready.k >= k:
            drafts = await ready.task
            # A hybrid's pipelined call is a lookup only (`DraftLengthPolicy.pipelined_model_k`):
            # where it found nothing and the model may draft this round, ask again, with the model.
            if drafts.proposal.token_ids or drafts.fallback or ready.model_k != 0 or model_k == 0:
                self.pipelined_hits += 1
                # Asked for more than this round drafts (adaptive k): a prefix is a draft too.
                return _first(drafts, k, model_k)
        elif ready is not None:
            await _cancel(ready.task)
        return _first(await self._call(list(tokens), k, model_k), k, model_k)

    def prefetch(
        self,
        tokens: Sequence[int],
        proposal: DraftProposal,
        guess: int | None,
        k_next: int,
        model_k_next: int | None = None,
    ) -> None:
        """Start the next round's proposal as if every draft and the guessed bonus are accepted."""
        if not self.pipeline or guess is None or k_next <= 0 or proposal.parents is not None:
            return
        context = list(tokens) + list(proposal.token_ids) + [guess]
        task = asyncio.create_task(self._call(context, k_next, model_k_next))
        self._next = PipelinedCall(tuple(context), k_next, model_k_next, task)

    async def cancel_pipelined(self) -> None:
        if self._next is not None:
            task, self._next = self._next.task, None
            await _cancel(task)

    async def _call(self, tokens: list[int], k: int, model_k: int | None) -> Drafts:
        """Everything the drafter proposes (one token more than k when pipelining: the guess);
        `_first` splits it into this round's drafts and the guess."""
        if self.clock() < self._retry_at:
            return Drafts(DraftProposal([]), None, fallback=True)
        extra = self._guess_slot
        try:
            call = self.proposer.propose(
                self.session_id,
                tokens,
                k + extra,
                self.sampling,
                model_k=self._model_k(k, model_k),
                affinity=self.affinity,
                tree=self.tree,
            )
            proposal = await asyncio.wait_for(call, self.timeout_s)
        except Exception as error:  # the draft tier is down, slow or broken: decode without it
            self.failures += 1
            self._retry_at = self.clock() + self.retry_s
            log.warning("draft tier unavailable (%s: %s); k = 0 for %.1f s", type(error).__name__, error, self.retry_s)
            return Drafts(DraftProposal([]), None, fallback=True)
        return Drafts(proposal, None)

    @property
    def _guess_slot(self) -> int:
        """1 where each call asks for one token more than the round drafts, the guess of the bonus
        (pipelining); a tree has no one next token to guess."""
        return 1 if self.pipeline and not self.tree else 0

    def _model_k(self, k: int, model_k: int | None) -> int | None:
        """The call's cap on a draft model's drafts (None: no cap beyond the call's k)."""
        if model_k is None or model_k >= k:
            return None
        # The guess rides on the model's cap too; a model capped at 0 stays at 0: asked for the
        # guess alone it would run (and catch up on every token since its last round) in each
        # pipelined call, beside the target's pass.
        return model_k + self._guess_slot if model_k else 0


def _first(drafts: Drafts, k: int, model_k: int | None = None) -> Drafts:
    """The first k drafts (model_k when a draft model answered), and the next one as the guess of
    the bonus token."""
    proposal = drafts.proposal
    if not is_lookup(proposal.source):
        k = model_draft_limit(k, model_k)
    ids, q = proposal.token_ids, proposal.draft_probs
    if len(ids) <= k:
        return drafts
    if proposal.parents is not None:  # the first k nodes: parents come first, so still a tree
        kept = DraftProposal(list(ids[:k]), None, proposal.source, list(proposal.parents[:k]))
        return Drafts(kept, None, drafts.fallback)
    return Drafts(
        DraftProposal(list(ids[:k]), q[:k] if q is not None else None, proposal.source), ids[k], drafts.fallback
    )


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
