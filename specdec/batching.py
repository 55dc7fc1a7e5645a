"""One forward pass for many sessions, each with its own KV cache and its own new tokens.

Continuous batching on both tiers: whatever rounds are queued when the model is free go through
the model together, and each session's cache ends exactly as an unbatched forward leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from specdec.kv_cache import SequenceCache


def batched_forward(
    model: PreTrainedModel,
    items: Sequence[tuple[SequenceCache, Sequence[int]]],
    logits_to_keep: Sequence[int],
) -> list[torch.Tensor]:
    """Append each item's new tokens to its cache; returns, per item, the logits of its last
    `logits_to_keep[i]` new positions, (logits_to_keep[i], vocab)."""
    results = []
    for (session, new_tokens), keep in zip(items, logits_to_keep):
        input_ids = torch.tensor([list(new_tokens)], dtype=torch.long)
        out = model(input_ids=input_ids, cache=session.cache, use_cache=True, logits_to_keep=keep)
        session.tokens.extend(new_tokens)
        results.append(out.logits[0])  # (keep, vocab)
    return results
