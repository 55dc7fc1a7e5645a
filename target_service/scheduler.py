"""Who runs the next pass of the target engine, and what each row feeds (no model here).

The scheduler owns everything about a pass that is decided before the forward: admission, the
token budget, chunked prefill, pinning and preemption. It holds the sessions (a `SessionStore`
of `PagedSession`s) and grows their block tables in the KV pool; the verifier runs the plan it
returns (`PassPlan`) and applies the acceptance rule; the actor only queues and gathers rounds.

- Admission (`admit`): a request names the prefix it says this actor holds; the scheduler turns
  it into the round's whole context, or answers a miss when the prefix is not held (the
  coordinator's token list is the only authority: the pool resends it). A round beyond the
  model's context is refused before it reaches a pass.
- The budget (`pass_tokens`): new tokens per pass. Whole rounds (decode and verify rows) are
  planned first, prefill chunks in what is left, so one long prompt never takes the budget from
  the rows beside it and goes in over several passes. The first row of a pass always goes when
  its context part is a single token, so every pass makes progress even when a round's drafts
  alone exceed the budget.
- Pinning: the sessions of the items planned are pinned in the store from planning until the pass
  is over (`schedule`'s `with` block): neither the LRU, the TTL nor a preemption takes a session
  whose row is in the forward, nor one the rollback after it resizes.
- Preemption: when a row's blocks are short, sessions outside the pass are dropped, least recently
  used first (their next round is a miss the pool resends); a row whose blocks cannot be found
  even then waits for a later pass. Blocks in use never exceed the pool.
- A round that is bad in itself (no context, a context beyond the pool, a token outside the
  vocabulary, q of the wrong shape, a malformed tree) is `rejected`: it fails its own call only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from specdec.core import tree
from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.core.session_store import SessionStore
from specdec.runtime.kv_pool import KVBlockPool, PagedSession
from specdec.runtime.ragged import Row
from specdec.target_service.protocol import VerifyRequest

DEFAULT_PASS_TOKENS = 256  # new tokens per pass: a prefill beyond it goes in chunks


@dataclass(eq=False)
class VerifyItem:
    """One round to verify. Known by identity, not by value: a pass's results are keyed by the
    item itself, and two rounds of one session may wait in the same pass (equal or not)."""

    session_id: str
    tokens: Sequence[int]  # the committed sequence (prompt + generated)
    proposal: DraftProposal  # k drafts to check (k may be 0)
    sampling: SamplingParams


class ItemRejected(ValueError):
    """A round this verifier can never serve (its context exceeds the pool): fails that call only."""


@dataclass(frozen=True)
class ScheduledRow:
    """One row of a pass: an item's session, grown by the row's tokens (its blocks are reserved)."""

    item: VerifyItem  # the round this row feeds
    session: PagedSession
    row: Row  # what the ragged forward takes: the new tokens, the logits kept, a tree's parents
    decides: bool  # the round's last row (its k+1 logits decide it); else a prefill chunk (keep 0)


@dataclass
class PassPlan:
    """One pass: its rows in the order of the ragged batch (whole rounds, then prefill chunks), and
    the items that fail alone. An item in neither needs a later pass (it waits for blocks, for a
    session slot, or for budget; or a second round of a session already in the pass)."""

    rows: list[ScheduledRow] = field(default_factory=list)
    rejected: dict[VerifyItem, ItemRejected] = field(default_factory=dict)  # why each can never run
    tokens: int = 0  # new tokens the rows feed: within the budget, but for a first row (see the module)

    @property
    def batch(self) -> list[Row]:
        return [scheduled.row for scheduled in self.rows]

    @property
    def deciding(self) -> list[ScheduledRow]:
        """The rows that decide their round, in batch order: their kept logits are the pass's."""
        return [scheduled for scheduled in self.rows if scheduled.decides]


class Scheduler:
    def __init__(
        self,
        pool: KVBlockPool,
        sessions: SessionStore[PagedSession] | None = None,
        pass_tokens: int = DEFAULT_PASS_TOKENS,
        *,
        vocab_in: int,  # token ids a row may feed: the input embeddings' rows
        vocab_size: int,  # the model's vocabulary: q may not have more columns
        max_context: int,  # positions the model takes (admission refuses longer rounds)
    ):
        self.pool = pool
        self.pass_tokens = pass_tokens
        self.vocab_in, self.vocab_size, self.max_context = vocab_in, vocab_size, max_context
        # Unbounded unless the owner passes a bounded store (the actor does: LRU, TTL, tokens).
        self.sessions = sessions if sessions is not None else SessionStore(size=cached_tokens)
        self.sessions.on_remove = lambda session: pool.release(session.table)

    def admit(self, request: VerifyRequest) -> VerifyItem | ItemRejected | None:
        """The round `request` asks for, over its whole committed context; None when this actor
        lacks the prefix the request says it holds (a miss); ItemRejected when the round is beyond
        the model's context (the engine never asks this; a caller that does gets a clear error,
        not a wrong answer)."""
        context = self._context(request)
        if context is None:
            return None
        if len(context) + len(request.draft_ids) > self.max_context:
            return ItemRejected(
                f"{len(context)} tokens plus {len(request.draft_ids)} drafts exceed "
                f"the model's context of {self.max_context}"
            )
        proposal = DraftProposal(list(request.draft_ids), request.draft_probs, parents=request.draft_parents)
        return VerifyItem(request.session_id, context, proposal, request.sampling)

    def _context(self, request: VerifyRequest) -> list[int] | None:
        """The full committed sequence, or None when this actor lacks the prefix it should hold."""
        if request.committed_len == 0:
            return list(request.new_tokens)
        if request.session_id not in self.sessions:
            return None
        held = self.sessions[request.session_id].tokens
        if len(held) < request.committed_len:
            return None
        return held[: request.committed_len] + list(request.new_tokens)

    @contextmanager
    def schedule(self, items: Sequence[VerifyItem]) -> Iterator[PassPlan]:
        """Plan one pass over as much of `items` as fits, with the sessions of all of them pinned
        until the `with` block (the forward and the rollbacks) is over. The rows' blocks are taken
        already: the caller runs the plan."""
        self.sessions.pinned = {item.session_id for item in items}
        try:
            yield self._plan(items)
        finally:
            self.sessions.pinned = set()

    def _plan(self, items: Sequence[VerifyItem]) -> PassPlan:
        plan = PassPlan()
        in_pass: set[str] = set()
        # Whole rounds first (decode and verify rows), then prefill chunks in what is left:
        # a long prompt never takes the budget from the rows beside it.
        for chunks in (False, True):
            for item in items:
                budget = self.pass_tokens - plan.tokens
                if budget <= 0:
                    break
                if item in plan.rejected or item.session_id in in_pass:
                    continue  # rejected, or planned already, or a second round of a session in the pass
                try:
                    scheduled = self._row(item, budget, chunks, first=chunks and not plan.rows)
                except ItemRejected as error:
                    plan.rejected[item] = error
                    continue
                if scheduled is None:
                    continue
                in_pass.add(item.session_id)
                plan.rows.append(scheduled)
                plan.tokens += len(scheduled.row.tokens)
        return plan

    def _row(self, item: VerifyItem, budget: int, chunks: bool, first: bool) -> ScheduledRow | None:
        """This pass's row for `item`: the whole rest of its round, or (when `chunks`) a chunk of
        its prefill; None when it must wait."""
        context, drafts = list(item.tokens), list(item.proposal.token_ids)
        self._check(item, context, drafts)
        if not self.sessions.has_room(item.session_id):
            return None  # every session held is in this pass: a new one waits for the next
        session = self._resume(item.session_id, context)
        rest = context[session.table.length :] + drafts
        if min(rest) < 0 or max(rest) >= self.vocab_in:
            raise ItemRejected(f"a token id outside [0, {self.vocab_in})")
        if len(rest) <= budget or first and len(rest) - len(drafts) <= 1:
            new, final = rest, True  # the first row always goes, so every pass makes progress
        elif not chunks:
            return None
        else:
            new, final = context[session.table.length :][: min(budget, len(context) - 1 - session.table.length)], False
            if not new:
                return None
        if not self._reserve(session, new):
            return None
        parents = _tree_of(item.proposal) if final else None
        row = Row(session.table, new, len(drafts) + 1 if final else 0, parents)
        return ScheduledRow(item, session, row, final)

    def _check(self, item: VerifyItem, context: list[int], drafts: list[int]) -> None:
        """Raise ItemRejected when `item` can never be served, whatever the pass."""
        if not context:
            raise ItemRejected("a round needs at least one committed token")
        if len(context) + len(drafts) > self.pool.capacity_tokens:
            raise ItemRejected(
                f"{len(context)} tokens plus {len(drafts)} drafts exceed the KV pool of "
                f"{self.pool.capacity_tokens} positions (--kv-cache-bytes)"
            )
        q = item.proposal.draft_probs
        if q is not None and (q.dim() != 2 or q.shape[0] != len(drafts) or q.shape[1] > self.vocab_size):
            raise ItemRejected(f"draft_probs of shape {tuple(q.shape)} for {len(drafts)} drafts")
        if item.proposal.parents is not None:
            try:
                tree.check(item.proposal.parents, len(drafts))
            except ValueError as error:
                raise ItemRejected(str(error)) from None
            if q is not None and not tree.is_chain(item.proposal.parents):
                raise ItemRejected("model drafts (with draft_probs) verify as chains, not trees")

    def _resume(self, session_id: str, context: list[int]) -> PagedSession:
        """The session cut back to what it shares with `context`, leaving out at least the last
        token (its logits are the ones the round needs). An unknown session starts empty."""
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = PagedSession()
        self.pool.resume(session, context)
        return session

    def _reserve(self, session: PagedSession, new: list[int]) -> bool:
        """Extend the session by `new`, preempting sessions outside the pass (least recently
        used first) while blocks are short; False when that is not enough."""
        while self.pool.blocks_needed(session.table, session.table.length + len(new)) > self.pool.free_blocks:
            if not self.sessions.evict_one():
                return False
        self.pool.extend(session, new)
        return True


def _tree_of(proposal: DraftProposal) -> list[int] | None:
    """The proposal's parents when it is a tree that is not a chain (a chain verifies as one)."""
    parents = proposal.parents
    return None if parents is None or tree.is_chain(parents) else list(parents)


def cached_tokens(session: PagedSession) -> int:
    """What a session counts against the store's token bound: its cached positions."""
    return len(session.tokens)
