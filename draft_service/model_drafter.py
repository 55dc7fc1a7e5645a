"""A small causal LM as the drafter, on the same paged engine as the target.

Each session's KV lives in the drafter's block pool (`specdec.runtime.kv_pool`); every step of a
batch is one ragged forward over all sessions still drafting (`specdec.runtime.ragged`). Each
call names the full context; the drafter keeps the longest prefix it already holds, cuts the rest
(the rejected drafts of the last round, which frees whole blocks) and feeds only what is new.
A session whose blocks cannot be found drafts fewer tokens (none, if its context does not fit):
drafts are proposals, never output. A session ended or evicted while its batch runs is freed
when the batch ends, so no block is ever held by two sessions. When
sampling, token i is drawn from the warped draft distribution q_i with the request's keyed noise
at its absolute position, and q travels with the proposal for the acceptance test.

Greedy drafts stop early at the first token the draft itself is unsure of (its probability below
`min_confidence`, as transformers' assisted generation does with assistant_confidence_threshold):
a weak draft's confident guesses are right far more often than its average one (the shipped
distilled draft's figures: docs/distilled-draft.md), and an unsure token costs a verify
position that it rarely pays back. The stop depends on the draft alone, so greedy output is
unchanged. Sampled requests keep their k: their output depends on how the drafts were cut.
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping, Sequence

import torch

from specdec.core import rng
from specdec.core.acceptance import DraftProposal
from specdec.core.rng import Stream
from specdec.core.sampling import SamplingParams, warp
from specdec.draft_service.drafter import DraftRequest
from specdec.drafts.pruned_draft import warp_pruned
from specdec.runtime.kv_pool import OutOfBlocks, PagedSession
from specdec.runtime.models import LoadedModel
from specdec.runtime.ragged import Row, paged_pool, ragged_forward


class ModelDrafter:
    def __init__(
        self,
        loaded: LoadedModel,
        sessions: MutableMapping[str, PagedSession] | None = None,
        min_confidence: float | None = None,
        kv_cache_bytes: int | None = None,
    ):
        if min_confidence is None:  # the draft's own (draft.json of a distilled draft), else off
            min_confidence = loaded.min_confidence
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"min_confidence must lie in [0, 1), got {min_confidence}")
        self.loaded = loaded
        self.min_confidence = min_confidence  # greedy drafts end before a token the draft gives less
        self.pool = paged_pool(loaded.model, kv_cache_bytes)
        # Any mapping works: the draft server passes a bounded store (LRU, TTL) that calls
        # `release` for what it drops, where an evicted session is simply a miss: a fresh prefill.
        self.sessions = sessions if sessions is not None else {}
        self._lock = threading.Lock()
        self._in_batch: set[int] = set()  # id() of the sessions the running batch uses
        self._release_later: list[PagedSession] = []
        # A pruned-vocabulary draft (specdec.drafts.pruned_draft): warp only its own columns. Same q
        # (it is zero elsewhere either way), but top-p sorts 32,768 logits instead of 262,144.
        self._vocab_ids = getattr(loaded.model.get_output_embeddings(), "vocab_ids", None)

    def propose(self, session_id: str, tokens: Sequence[int], k: int, sampling: SamplingParams) -> DraftProposal:
        return self.propose_batch([DraftRequest(session_id, tokens, k, sampling)])[0]

    @torch.inference_mode()
    def propose_batch(self, items: Sequence[DraftRequest]) -> list[DraftProposal]:
        """Draft for several sessions at once: step j runs one ragged forward over every session
        that still wants a j-th token. Per-session results equal one-at-a-time results."""
        proposals = [DraftProposal([], source="model") for _ in items]
        rows: list[list[torch.Tensor]] = [[] for _ in items]
        active = [i for i, item in enumerate(items) if item.k > 0]
        sessions = {i: self._resume(items[i].session_id, items[i].tokens) for i in active}
        feeds = {i: list(items[i].tokens)[len(sessions[i].tokens) :] for i in active}
        try:
            step = 0
            while active:
                active = [i for i in active if self._grow(sessions[i], feeds[i])]
                if not active:
                    break
                passes = [Row(sessions[i].table, feeds[i], 1) for i in active]
                logits = ragged_forward(self.loaded.model, self.pool, passes)  # (len(active), vocab)
                unsure = set()
                for i, row in zip(active, logits):
                    item = items[i]
                    if item.sampling.greedy:
                        token = int(torch.argmax(row))
                        if self.min_confidence > 0.0 and self._confidence(row, token) < self.min_confidence:
                            unsure.add(i)  # this token and any after it stay undrafted
                            continue
                    else:
                        q = (
                            warp(row, item.sampling)
                            if self._vocab_ids is None
                            else warp_pruned(row, item.sampling, self._vocab_ids)
                        )  # (vocab,)
                        token = rng.sample(q, item.sampling.seed, len(item.tokens) + step, Stream.DRAFT)
                        rows[i].append(q)
                    proposals[i].token_ids.append(token)
                    feeds[i] = [token]
                step += 1
                # The last draft token's own logits are never needed, so it is not fed.
                active = [i for i in active if items[i].k > step and i not in unsure]
        finally:
            self._end_batch(items, sessions)
        for proposal, q_rows in zip(proposals, rows):
            if q_rows:
                proposal.draft_probs = torch.stack(q_rows)  # (k, vocab)
        return proposals

    def _resume(self, session_id: str, tokens: Sequence[int]) -> PagedSession:
        """The session cut back to what it shares with `tokens`, leaving out at least the last
        token (its logits are the first draft's). An unknown session starts empty."""
        session = self.sessions.get(session_id)
        if session is None:
            session = PagedSession()
            self.sessions[session_id] = session
        with self._lock:
            self._in_batch.add(id(session))
        self.pool.resume(session, tokens)
        return session

    def _grow(self, session: PagedSession, feed: list[int]) -> bool:
        try:
            self.pool.extend(session, feed)
        except OutOfBlocks:
            return False  # no room: this session drafts what it has so far
        return True

    def _end_batch(self, items: Sequence[DraftRequest], sessions: dict[int, PagedSession]) -> None:
        """Free what left during the batch: sessions ended or evicted meanwhile, and those the
        mapping would not keep (evicted before they were stored)."""
        with self._lock:
            self._in_batch.clear()
            later, self._release_later = self._release_later, []
        for session in later:
            self.pool.release(session.table)
        for i, session in sessions.items():
            if self.sessions.get(items[i].session_id) is not session and all(s is not session for s in later):
                self.pool.release(session.table)

    def release(self, session: PagedSession) -> None:
        """Return a dropped session's blocks (now, or when the batch using it ends)."""
        with self._lock:
            if id(session) in self._in_batch:
                self._release_later.append(session)
                return
        self.pool.release(session.table)

    @staticmethod
    def _confidence(logits: torch.Tensor, token: int) -> float:
        """The draft's probability of `token` (pruned drafts: -inf outside their vocabulary)."""
        return float(torch.exp(logits[token].float() - torch.logsumexp(logits.float(), dim=-1)))

    def end_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self.release(session)
