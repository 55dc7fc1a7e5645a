"""The target model as a verifier, with a KV cache per session (no networking here).

One forward pass over [new context tokens, x_1..x_k] gives the target's logits at the k+1
positions that decide the round; the shared acceptance rule picks the tokens; the cache is
rolled back to the committed prefix plus the accepted drafts (the final target token is not
cached yet: it is fed at the start of the next round, as the drafter does).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.acceptance import DraftProposal, Verification, verify_greedy, verify_sampled
from specdec.kv_cache import SequenceCache, resume, rollback
from specdec.models import LoadedModel
from specdec.sampling import SamplingParams, warp


class TargetVerifier:
    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.sessions: dict[str, SequenceCache] = {}

    @torch.inference_mode()
    def verify(self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams) -> Verification:
        """tokens: the committed sequence (prompt + generated); proposal: k drafts to check."""
        tokens = list(tokens)
        draft_ids = list(proposal.token_ids)
        k = len(draft_ids)
        session, keep = resume(self.sessions, session_id, self.loaded.model, tokens)
        feed = tokens[keep:] + draft_ids
        input_ids = torch.tensor([feed], dtype=torch.long)
        # logits_to_keep: a prefill must not project every prompt position onto the vocabulary
        # (Gemma 3: 1 MiB of fp32 logits per position).
        out = self.loaded.model(input_ids=input_ids, cache=session.cache, use_cache=True, logits_to_keep=k + 1)
        logits = out.logits[0]  # (k+1, vocab): positions of x_1..x_k and the one after
        if sampling.greedy:
            result = verify_greedy(logits, draft_ids)
        else:
            probs = warp(logits, sampling)  # (k+1, vocab)
            proposal = DraftProposal(draft_ids, _match_vocab(proposal.draft_probs, probs.shape[-1]))
            result = verify_sampled(probs, proposal, sampling.seed, first_position=len(tokens))
        rollback(session.cache, k - result.num_accepted)
        session.tokens.extend(feed[: len(feed) - (k - result.num_accepted)])
        return result

    def end_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)


def _match_vocab(q: torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    """A draft sharing the tokenizer may have fewer output rows (padding differs): pad q with 0."""
    if q is None or q.shape[-1] == vocab:
        return q
    return torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))
