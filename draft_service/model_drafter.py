"""A small causal LM as the drafter, with a KV cache per session.

Each call names the full context; the drafter keeps the longest prefix it already has cached,
rolls back the rest (the rejected drafts of the last round) and feeds only what is new. When
sampling, token i is drawn from the warped draft distribution q_i with the request's keyed noise
at its absolute position, and q travels with the proposal for the acceptance test.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

import torch

from specdec import rng
from specdec.acceptance import DraftProposal
from specdec.batching import batched_forward
from specdec.kv_cache import SequenceCache, resume
from specdec.models import LoadedModel
from specdec.pruned_draft import warp_pruned
from specdec.rng import Stream
from specdec.sampling import SamplingParams, warp


@dataclass
class ProposeItem:
    session_id: str
    tokens: Sequence[int]  # the whole committed sequence
    k: int  # draft tokens wanted
    sampling: SamplingParams


class ModelDrafter:
    def __init__(self, loaded: LoadedModel, sessions: MutableMapping[str, SequenceCache] | None = None):
        self.loaded = loaded
        # Any mapping works: the draft server passes a bounded store (LRU, TTL), where an evicted
        # session is simply a cache miss that `resume` answers with a fresh prefill.
        self.sessions = sessions if sessions is not None else {}
        # A pruned-vocabulary draft (specdec.pruned_draft): warp only its own columns. Same q (it is
        # zero elsewhere either way), but top-p sorts 32,768 logits instead of 262,144.
        self._vocab_ids = getattr(loaded.model.get_output_embeddings(), "vocab_ids", None)

    def propose(self, session_id: str, tokens: Sequence[int], k: int, sampling: SamplingParams) -> DraftProposal:
        return self.propose_batch([ProposeItem(session_id, tokens, k, sampling)])[0]

    @torch.inference_mode()
    def propose_batch(self, items: Sequence[ProposeItem]) -> list[DraftProposal]:
        """Draft for several sessions at once: step j runs one batched forward over every session
        that still wants a j-th token. Per-session results equal one-at-a-time results."""
        proposals = [DraftProposal([]) for _ in items]
        rows: list[list[torch.Tensor]] = [[] for _ in items]
        active = [i for i, item in enumerate(items) if item.k > 0]
        feeds = {}
        sessions = {}
        for i in active:
            tokens = list(items[i].tokens)
            sessions[i], keep = resume(self.sessions, items[i].session_id, self.loaded.model, tokens)
            feeds[i] = tokens[keep:]
        step = 0
        while active:
            logits = batched_forward(self.loaded.model, [(sessions[i], feeds[i]) for i in active], [1] * len(active))
            for i, row in zip(active, logits):
                item = items[i]
                if item.sampling.greedy:
                    token = int(torch.argmax(row[-1]))
                else:
                    q = warp(row[-1], item.sampling) if self._vocab_ids is None else warp_pruned(row[-1], item.sampling, self._vocab_ids)  # (vocab,)
                    token = rng.sample(q, item.sampling.seed, len(item.tokens) + step, Stream.DRAFT)
                    rows[i].append(q)
                proposals[i].token_ids.append(token)
                feeds[i] = [token]
            step += 1
            # The last draft token's own logits are never needed, so it is not fed.
            active = [i for i in active if items[i].k > step]
        for proposal, q_rows in zip(proposals, rows):
            if q_rows:
                proposal.draft_probs = torch.stack(q_rows)  # (k, vocab)
        # No trim here: sliding layers keep this burst until the next call's rollback drops the
        # rejected drafts, which they could not do once trimmed to their window.
        return proposals

    def end_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
