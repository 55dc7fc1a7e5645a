"""A small causal LM as the drafter, with a KV cache per session.

Each call names the full context; the drafter keeps the longest prefix it already has cached,
rolls back the rest (the rejected drafts of the last round) and feeds only what is new. When
sampling, token i is drawn from the warped draft distribution q_i with the request's keyed noise
at its absolute position, and q travels with the proposal for the acceptance test.

Greedy drafts stop early at the first token the draft itself is unsure of (its probability below
`min_confidence`, as transformers' assisted generation does with assistant_confidence_threshold):
a weak draft's confident guesses are right far more often than its average one (the distilled
draft on free continuation: 40% of the tokens it gives at least 0.3 are the target's, 14% of
the rest), and an unsure token costs a verify position that it rarely pays back. The stop
depends on the draft alone, so greedy output is unchanged. Sampled requests keep their k: their
output depends on how the drafts were cut.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

import torch

from specdec.core import rng
from specdec.core.acceptance import DraftProposal
from specdec.core.rng import Stream
from specdec.core.sampling import SamplingParams, warp
from specdec.drafts.pruned_draft import warp_pruned
from specdec.runtime.batching import batched_forward
from specdec.runtime.kv_cache import SequenceCache, resume
from specdec.runtime.models import LoadedModel


@dataclass
class ProposeItem:
    session_id: str
    tokens: Sequence[int]  # the whole committed sequence
    k: int  # draft tokens wanted
    sampling: SamplingParams
    # A hybrid's cap on what its model drafts (lookups keep k); None: k. The model drafter itself
    # is only ever handed items already capped.
    model_k: int | None = None


class ModelDrafter:
    def __init__(
        self,
        loaded: LoadedModel,
        sessions: MutableMapping[str, SequenceCache] | None = None,
        min_confidence: float | None = None,
    ):
        if min_confidence is None:  # the draft's own (draft.json of a distilled draft), else off
            min_confidence = loaded.min_confidence
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"min_confidence must lie in [0, 1), got {min_confidence}")
        self.loaded = loaded
        self.min_confidence = min_confidence  # greedy drafts end before a token the draft gives less
        # Any mapping works: the draft server passes a bounded store (LRU, TTL), where an evicted
        # session is simply a cache miss that `resume` answers with a fresh prefill.
        self.sessions = sessions if sessions is not None else {}
        # A pruned-vocabulary draft (specdec.drafts.pruned_draft): warp only its own columns. Same q
        # (it is zero elsewhere either way), but top-p sorts 32,768 logits instead of 262,144.
        self._vocab_ids = getattr(loaded.model.get_output_embeddings(), "vocab_ids", None)

    def propose(self, session_id: str, tokens: Sequence[int], k: int, sampling: SamplingParams) -> DraftProposal:
        return self.propose_batch([ProposeItem(session_id, tokens, k, sampling)])[0]

    @torch.inference_mode()
    def propose_batch(self, items: Sequence[ProposeItem]) -> list[DraftProposal]:
        """Draft for several sessions at once: step j runs one batched forward over every session
        that still wants a j-th token. Per-session results equal one-at-a-time results."""
        proposals = [DraftProposal([], source="model") for _ in items]
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
            unsure = set()
            for i, row in zip(active, logits):
                item = items[i]
                if item.sampling.greedy:
                    token = int(torch.argmax(row[-1]))
                    if self.min_confidence > 0.0 and self._confidence(row[-1], token) < self.min_confidence:
                        unsure.add(i)  # this token and any after it stay undrafted
                        continue
                else:
                    q = (
                        warp(row[-1], item.sampling)
                        if self._vocab_ids is None
                        else warp_pruned(row[-1], item.sampling, self._vocab_ids)
                    )  # (vocab,)
                    token = rng.sample(q, item.sampling.seed, len(item.tokens) + step, Stream.DRAFT)
                    rows[i].append(q)
                proposals[i].token_ids.append(token)
                feeds[i] = [token]
            step += 1
            # The last draft token's own logits are never needed, so it is not fed.
            active = [i for i in active if items[i].k > step and i not in unsure]
        for proposal, q_rows in zip(proposals, rows):
            if q_rows:
                proposal.draft_probs = torch.stack(q_rows)  # (k, vocab)
        # No trim here: sliding layers keep this burst until the next call's rollback drops the
        # rejected drafts, which they could not do once trimmed to their window.
        return proposals

    @staticmethod
    def _confidence(logits: torch.Tensor, token: int) -> float:
        """The draft's probability of `token` (pruned drafts: -inf outside their vocabulary)."""
        return float(torch.exp(logits[token].float() - torch.logsumexp(logits.float(), dim=-1)))

    def end_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
