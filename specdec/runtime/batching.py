"""One forward pass for many sessions, each with its own KV cache and its own new tokens.

Continuous batching on both tiers: whatever rounds are queued when the model is free go through
the model together, and each session's cache ends exactly as an unbatched forward leaves it.

Layout of the batch (C = longest cache, N = most new tokens), one row per session:

    [ left pad | cached_i ][ new_i | right pad ]
    0          C - c_i    C        C + n_i     C + N

Each row's real tokens are contiguous, so the index-based causal and sliding-window masks of
transformers see the same distances as positions (explicit `position_ids` carry the real ones).
Only the left pads are masked out: right pads come after every real token of their row, so
causality already hides them, and letting them attend keeps their query rows from being fully
masked (a NaN there would leak into real rows through 0 * NaN in the attention product).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from specdec.runtime.kv_cache import SequenceCache, new_cache
from specdec.runtime.projection import forward_logits


def batched_forward(
    model: PreTrainedModel,
    items: Sequence[tuple[SequenceCache, Sequence[int]]],
    logits_to_keep: Sequence[int],
) -> list[torch.Tensor]:
    """Append each item's new tokens to its cache; returns, per item, the logits of its last
    `logits_to_keep[i]` new positions, (logits_to_keep[i], vocab).

    Items go through the model in buckets of similar new-token counts (1, 2, 3-4, 5-8, ...):
    every row of a pass is padded to its longest, and one prompt prefill among decode rounds
    makes a batch 2.8x slower than one item at a time (bench/README.md); within a bucket
    padding wastes at most half a row.
    """
    buckets: dict[int, list[int]] = {}
    for i, (_, new_tokens) in enumerate(items):
        buckets.setdefault(_bucket(len(new_tokens)), []).append(i)
    results: list[torch.Tensor] = [None] * len(items)  # type: ignore[list-item]
    for members in buckets.values():
        out = _forward(model, [items[i] for i in members], [logits_to_keep[i] for i in members])
        for i, logits in zip(members, out):
            results[i] = logits
    return results


def _bucket(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()  # 1, 2, 4, 8, ...: the power of two at or above n


def _forward(
    model: PreTrainedModel,
    items: Sequence[tuple[SequenceCache, Sequence[int]]],
    logits_to_keep: Sequence[int],
) -> list[torch.Tensor]:
    """One forward pass over `items` (the layout in the module docstring)."""
    if len(items) == 1:
        (session, new_tokens), keep = items[0], logits_to_keep[0]
        logits = forward_logits(
            model, keep, input_ids=torch.tensor([list(new_tokens)]), cache=session.cache, use_cache=True
        )
        session.tokens.extend(new_tokens)
        return [logits[0]]  # (keep, vocab)

    cached = [len(session.tokens) for session, _ in items]  # c_i
    news = [list(tokens) for _, tokens in items]  # n_i tokens each
    C, N, B = max(cached), max(len(t) for t in news), len(items)
    input_ids = torch.zeros(B, N, dtype=torch.long)  # right pads: token 0, harmless
    attention_mask = torch.zeros(B, C + N, dtype=torch.long)
    for i, (c, new) in enumerate(zip(cached, news)):
        input_ids[i, : len(new)] = torch.tensor(new)
        attention_mask[i, C - c :] = 1
    position_ids = torch.tensor(cached).unsqueeze(1) + torch.arange(N)  # (B, N)

    batch = new_cache(model)
    for index, layer in enumerate(batch.layers):
        _gather(layer, [session.cache.layers[index] for session, _ in items], cached)
    # Keep only positions some row needs on the vocabulary (a prefill row needs just its last).
    wanted = sorted({p for new, keep in zip(news, logits_to_keep) for p in range(len(new) - keep, len(new))})
    logits = forward_logits(
        model,
        torch.tensor(wanted),
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=batch,
        use_cache=True,
    )
    column = {p: j for j, p in enumerate(wanted)}
    results = []
    for i, ((session, _), new, keep) in enumerate(zip(items, news, logits_to_keep)):
        for index, layer in enumerate(batch.layers):
            _scatter(layer, session.cache.layers[index], i, cached[i], len(new), N)
        session.tokens.extend(new)
        rows = [column[p] for p in range(len(new) - keep, len(new))]
        results.append(logits[i, rows])  # (keep, vocab)
    return results


def _window(layer) -> int | None:
    return getattr(layer, "sliding_window", None)


def _slots(layer, longest: int) -> int:
    """Cache index slots a batch layer holds before the forward: all C, or a sliding window's
    last `window - 1` (the index range its mask offset assumes)."""
    window = _window(layer)
    return longest if window is None else min(longest, window - 1)


def _gather(batch_layer, layers, cached: list[int]) -> None:
    """Stack the sessions' states right-aligned at index C into one (B, heads, slots, dim) layer."""
    longest = max(cached)
    live = [layer for layer in layers if layer.is_initialized and layer.keys is not None and layer.keys.numel()]
    if not live or longest == 0:
        return  # every row is a prefill: the layer starts empty, as for a single sequence
    slots = _slots(batch_layer, longest)
    template_k, template_v = live[0].keys, live[0].values  # (1, heads, len, dim)
    keys = template_k.new_zeros(len(layers), template_k.shape[1], slots, template_k.shape[3])
    values = template_v.new_zeros(len(layers), template_v.shape[1], slots, template_v.shape[3])
    for i, (layer, c) in enumerate(zip(layers, cached)):
        n = min(c, slots)  # this row's real states among the slots
        if n:
            keys[i, :, slots - n :] = layer.keys[0, :, -n:]
            values[i, :, slots - n :] = layer.values[0, :, -n:]
    batch_layer.lazy_initialization(keys, values)
    batch_layer.keys, batch_layer.values = keys, values
    if _window(batch_layer) is not None:
        batch_layer.cumulative_length = longest


def _scatter(batch_layer, layer, row: int, cached: int, new: int, width: int) -> None:
    """Give one session back its states: its real cached slots plus its new positions."""
    held = batch_layer.keys.shape[-2] - width  # slots before this forward's N positions
    start = held - min(cached, held)
    end = held + new
    keys = batch_layer.keys[row : row + 1, :, start:end].clone()  # clone: free the batch tensor
    values = batch_layer.values[row : row + 1, :, start:end].clone()
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    if _window(layer) is not None:
        layer.cumulative_length = cached + new
