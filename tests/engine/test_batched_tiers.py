"""Both tiers batch sessions into one forward pass without changing any session's result."""

from __future__ import annotations

import pytest
import torch

from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.draft_service.drafter import DraftRequest
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.target_service.verifier import TargetVerifier, VerifyItem

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=40, seed=11)


def _context(seed: int, n: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _verify_items(round_: int) -> list[VerifyItem]:
    """8 sessions: different lengths (past the window of 8), k from 0 to 7, greedy and sampled."""
    items = []
    for i in range(8):
        tokens = _context(i, 3 + 4 * i + round_)
        drafts = _context(100 + i + round_, i)
        sampling = GREEDY if i % 2 else SAMPLED
        q = None
        if not sampling.greedy and i % 4 == 0 and drafts:
            q = torch.softmax(torch.randn(len(drafts), 259, generator=torch.Generator().manual_seed(i)), -1)
        items.append(VerifyItem(f"s{i}", tokens, DraftProposal(drafts, q), sampling))
    return items


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_batched_verification_equals_one_at_a_time(tiny, kind):
    target = tiny(kind, 1)
    batched, alone = TargetVerifier(target), TargetVerifier(target)
    for round_ in range(2):  # the second round reuses the caches the first one left
        items = _verify_items(round_)
        together = batched.verify_batch(items)
        single = [alone.verify(it.session_id, it.tokens, it.proposal, it.sampling) for it in items]
        assert together == single


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_batched_drafting_equals_one_at_a_time(tiny, kind):
    draft = tiny(kind, 2)
    batched, alone = ModelDrafter(draft), ModelDrafter(draft)
    for round_ in range(2):
        items = [
            DraftRequest(f"s{i}", _context(i, 2 + 5 * i + round_), 1 + i % 5, GREEDY if i % 2 else SAMPLED)
            for i in range(8)
        ]
        together = batched.propose_batch(items)
        single = [alone.propose(it.session_id, it.tokens, it.k, it.sampling) for it in items]
        for a, b in zip(together, single):
            assert a.token_ids == b.token_ids
            assert (a.draft_probs is None) == (b.draft_probs is None)
            if a.draft_probs is not None:
                assert torch.allclose(a.draft_probs, b.draft_probs, atol=1e-5)
