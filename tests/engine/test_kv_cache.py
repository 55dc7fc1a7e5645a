"""Rolling back n positions and appending again gives the logits of a fresh prefill."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime.kv_cache import RollbackError, SequenceCache, new_cache, resume, rollback

SEQ = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]  # 20 > window 8
OTHER = [11, 22, 33, 44]


def _logits(model, cache, ids):
    return model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[0]  # (len, vocab)


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["llama", "gemma3"])  # a dynamic cache and a hybrid sliding-window one
@pytest.mark.parametrize("dropped", [1, 3, 5])
def test_rollback_then_append_equals_fresh_prefill(tiny, kind, dropped):
    model = tiny(kind).model
    fresh = _logits(model, new_cache(model), SEQ[:-dropped] + OTHER)[-len(OTHER) :]

    cache = new_cache(model)
    _logits(model, cache, SEQ[:12])
    rollback(cache, 0)
    _logits(model, cache, SEQ[12:])  # the burst that the rollback undoes part of
    rollback(cache, dropped)
    assert cache.get_seq_length() == len(SEQ) - dropped
    rolled = _logits(model, cache, OTHER)
    assert torch.allclose(rolled, fresh, atol=1e-5), (rolled - fresh).abs().max()


@torch.inference_mode()
def test_sliding_layers_refuse_a_rollback_past_what_they_kept(tiny):
    model = tiny("gemma3").model
    cache = new_cache(model)
    _logits(model, cache, SEQ[:16])
    rollback(cache, 0)  # trims the sliding layers to window - 1
    _logits(model, cache, SEQ[16:])
    with pytest.raises(RollbackError):
        rollback(cache, 6)  # 4 were added since the trim, 6 would need states already dropped


@torch.inference_mode()
def test_resume_keeps_the_shared_prefix_and_misses_cleanly(tiny):
    model = tiny("gemma3").model
    sessions: dict[str, SequenceCache] = {}
    session, keep = resume(sessions, "s", model, SEQ[:10])
    assert keep == 0
    _logits(model, session.cache, SEQ[:10])
    session.tokens.extend(SEQ[:10])
    session, keep = resume(sessions, "s", model, SEQ[:8] + OTHER)
    assert keep == 8 and session.cache.get_seq_length() == 8
    _logits(model, session.cache, OTHER)
    session.tokens.extend(OTHER)
    rollback(session.cache, 0)
    # Diverging 6 positions back is beyond what the trimmed sliding layers hold: a fresh session.
    session, keep = resume(sessions, "s", model, SEQ[:6] + [1, 2, 3])
    assert keep == 0 and session.cache.get_seq_length() == 0 and sessions["s"] is session
