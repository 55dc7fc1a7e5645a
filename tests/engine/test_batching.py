"""A batched forward over many sessions equals one forward per session."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime.batching import batched_forward
from specdec.runtime.kv_cache import SequenceCache, new_cache, rollback

# (cached tokens, new tokens, logits kept): a prefill, short and long caches (past the sliding
# window of 8), single-token steps and verification-sized blocks of different lengths.
CASES = [
    (0, 11, 1),
    (5, 1, 1),
    (20, 5, 5),
    (13, 9, 9),
    (3, 2, 2),
    (30, 1, 1),
    (7, 17, 17),
    (0, 4, 4),
    (4, 30, 1),  # shares the 17-32 bucket with (7, 17, 17): 13 right pads, more than the window
]


def _tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prepared(model, cached: int, seed: int) -> SequenceCache:
    session = SequenceCache(new_cache(model))
    if cached:
        batched_forward(model, [(session, _tokens(seed, cached))], [1])
        rollback(session.cache, 0)  # trim sliding layers as the services do between rounds
    return session


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma3"])
def test_batched_equals_one_at_a_time(tiny, kind):
    model = tiny(kind, 1).model
    alone, together = [], []
    for seed, (cached, new, keep) in enumerate(CASES):
        session = _prepared(model, cached, seed)
        alone.append((session, batched_forward(model, [(session, _tokens(100 + seed, new))], [keep])[0]))
    sessions = [_prepared(model, cached, seed) for seed, (cached, _, _) in enumerate(CASES)]
    items = [(s, _tokens(100 + seed, new)) for seed, (s, (_, new, _)) in enumerate(zip(sessions, CASES))]
    together = batched_forward(model, items, [keep for _, _, keep in CASES])
    for (single_session, single), batched, session in zip(alone, together, sessions):
        assert batched.shape == single.shape
        assert torch.allclose(batched, single, atol=1e-4), (batched - single).abs().max()
        assert torch.equal(batched.argmax(-1), single.argmax(-1))
        assert session.tokens == single_session.tokens
    # The caches the batch left behind continue exactly like the unbatched ones.
    step = [(s, [7]) for s in sessions]
    after_batch = batched_forward(model, step, [1] * len(step))
    after_alone = [batched_forward(model, [(s, [7])], [1])[0] for s, _ in alone]
    for a, b in zip(after_batch, after_alone):
        assert torch.allclose(a, b, atol=1e-4)


@torch.inference_mode()
def test_rollback_after_a_batched_forward(tiny):
    model = tiny("gemma3", 1).model
    sessions = [_prepared(model, c, s) for s, c in enumerate((12, 3))]
    batched_forward(model, [(sessions[0], _tokens(50, 6)), (sessions[1], _tokens(51, 2))], [6, 2])
    rollback(sessions[0].cache, 4)
    del sessions[0].tokens[-4:]
    fresh = SequenceCache(new_cache(model))
    expected = batched_forward(model, [(fresh, sessions[0].tokens + [9])], [1])[0]
    got = batched_forward(model, [(sessions[0], [9])], [1])[0]
    assert torch.allclose(got, expected, atol=1e-4)
