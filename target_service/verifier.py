"""The target model as a verifier, with a KV cache per session (no networking here).

One forward pass over [new context tokens, x_1..x_k] gives the target's logits at the k+1
positions that decide a round; the shared acceptance rule picks the tokens; the cache is rolled
back to the committed prefix plus the accepted drafts (the final target token is not cached yet:
it is fed at the start of the next round, as the drafter does). `verify_batch` does this for
many sessions in one forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.core.acceptance import DraftProposal, Verification, verify_greedy, verify_sampled
from specdec.core.sampling import SamplingParams, warp
from specdec.core.session_store import SessionStore
from specdec.runtime.batching import batched_forward
from specdec.runtime.kv_cache import SequenceCache, resume, rollback
from specdec.runtime.models import LoadedModel


@dataclass
class VerifyItem:
    session_id: str
    tokens: Sequence[int]  # the committed sequence (prompt + generated)
    proposal: DraftProposal  # k drafts to check (k may be 0)
    sampling: SamplingParams


class TargetVerifier:
    def __init__(self, loaded: LoadedModel, sessions: SessionStore[SequenceCache] | None = None):
        self.loaded = loaded
        # Unbounded unless the owner passes a bounded store (the actor does: LRU, TTL, tokens).
        self.sessions = sessions if sessions is not None else SessionStore(size=cached_tokens)

    def verify(
        self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams
    ) -> Verification:
        return self.verify_batch([VerifyItem(session_id, tokens, proposal, sampling)])[0]

    @torch.inference_mode()
    def verify_batch(self, items: Sequence[VerifyItem]) -> list[Verification]:
        """Verify the rounds of several sessions in one forward pass; per-item results equal
        one-at-a-time results (same logits up to fp32 rounding, same keyed randomness)."""
        batch = []
        for item in items:
            tokens = list(item.tokens)
            session, keep = resume(self.sessions, item.session_id, self.loaded.model, tokens)
            batch.append((session, tokens[keep:] + list(item.proposal.token_ids)))
        keeps = [len(item.proposal.token_ids) + 1 for item in items]
        all_logits = batched_forward(self.loaded.model, batch, keeps)  # each (k+1, vocab)
        results = []
        for item, (session, _), logits in zip(items, batch, all_logits):
            result = _accept(item, logits)
            rejected = len(item.proposal.token_ids) - result.num_accepted
            rollback(session.cache, rejected)
            del session.tokens[len(session.tokens) - rejected :]
            self.sessions.resize(item.session_id)  # the cache grew: count it, evict others to fit
            results.append(result)
        return results

    def end_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)


def cached_tokens(session: SequenceCache) -> int:
    return len(session.tokens)


def _accept(item: VerifyItem, logits: torch.Tensor) -> Verification:
    """logits: (k+1, vocab) at the positions of x_1..x_k and the one after."""
    draft_ids = list(item.proposal.token_ids)
    if item.sampling.greedy:
        return verify_greedy(logits, draft_ids)
    probs = warp(logits, item.sampling)  # (k+1, vocab)
    proposal = DraftProposal(draft_ids, _match_vocab(item.proposal.draft_probs, probs.shape[-1]))
    return verify_sampled(probs, proposal, item.sampling.seed, first_position=len(item.tokens))


def _match_vocab(q: torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    """A draft sharing the tokenizer may have fewer output rows (padding differs): pad q with 0."""
    if q is None or q.shape[-1] == vocab:
        return q
    return torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))
