"""A small causal LM as the drafter, with a KV cache per session.

Each call names the full context; the drafter keeps the longest prefix it already has cached,
rolls back the rest (the rejected drafts of the last round) and feeds only what is new. When
sampling, token i is drawn from the warped draft distribution q_i with the request's keyed noise
at its absolute position, and q travels with the proposal for the acceptance test.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec import rng
from specdec.acceptance import DraftProposal
from specdec.kv_cache import SequenceCache, resume
from specdec.models import LoadedModel
from specdec.rng import Stream
from specdec.sampling import SamplingParams, warp


class ModelDrafter:
    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.sessions: dict[str, SequenceCache] = {}

    @torch.inference_mode()
    def propose(self, session_id: str, tokens: Sequence[int], k: int, sampling: SamplingParams) -> DraftProposal:
        if k <= 0:
            return DraftProposal([])
        session, logits = self._advance(session_id, list(tokens))
        draft_ids: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            if sampling.greedy:
                token = int(torch.argmax(logits))
            else:
                q_i = warp(logits, sampling)  # (vocab,)
                token = rng.sample(q_i, sampling.seed, len(tokens) + i, Stream.DRAFT)
                rows.append(q_i)
            draft_ids.append(token)
            if i + 1 < k:  # the last draft token's own logits are never needed
                logits = self._forward(session, [token])
        # No trim here: sliding layers keep this burst until the next call's rollback drops the
        # rejected drafts, which they could not do once trimmed to their window.
        return DraftProposal(draft_ids, torch.stack(rows) if rows else None)

    def end_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def _advance(self, session_id: str, tokens: list[int]) -> tuple[SequenceCache, torch.Tensor]:
        """Bring the session's cache to `tokens` and return the logits after the last one."""
        session, keep = resume(self.sessions, session_id, self.loaded.model, tokens)
        return session, self._forward(session, tokens[keep:])

    def _forward(self, session: SequenceCache, new_tokens: list[int]) -> torch.Tensor:
        input_ids = torch.tensor([new_tokens], dtype=torch.long)
        out = self.loaded.model(input_ids=input_ids, cache=session.cache, use_cache=True, logits_to_keep=1)
        session.tokens.extend(new_tokens)
        return out.logits[0, -1]  # (vocab,)
