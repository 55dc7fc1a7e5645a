"""The one KV-cache rollback primitive.

transformers 5 caches drop positions only with a negative `crop(-n)`. Sliding-window layers
(Gemma 3's hybrid cache) normally keep just the last `window - 1` positions, so a rollback could
need states they already threw away; with past recording on they keep everything added since the
last crop, and each crop trims them back. Hence the protocol every cache owner here follows:
create caches with `new_cache`, and call `rollback(cache, n)` (n >= 0, 0 just trims) after each
forward or burst of forwards, dropping at most what that burst added past the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import DynamicCache, PreTrainedModel


class RollbackError(RuntimeError):
    """The cache no longer holds the states a rollback needs; the owner must prefill again."""


def new_cache(model: PreTrainedModel) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache


def cached_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def rollback(cache: DynamicCache, n: int) -> None:
    """Drop the last n positions of every layer (n == 0 trims sliding layers to their window)."""
    if n < 0:
        raise ValueError(f"rollback needs n >= 0, got {n}")
    if n > cached_length(cache):
        raise RollbackError(f"cannot drop {n} positions from a cache of {cached_length(cache)}")
    for layer in cache.layers:
        window = getattr(layer, "sliding_window", None)
        if window is None or not layer.is_initialized:
            continue
        kept = layer.keys.shape[-2] - n  # positions physically left after the drop
        needed = min(layer.cumulative_length - n, window - 1)  # what the next forward attends to
        if kept < needed:
            raise RollbackError(f"sliding layer holds {layer.keys.shape[-2]} positions, cannot drop {n}")
    cache.crop(-n)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class SequenceCache:
    """A KV cache and exactly the tokens whose positions it holds."""

    cache: DynamicCache
    tokens: list[int] = field(default_factory=list)


def resume(
    sessions: dict[str, SequenceCache], session_id: str, model: PreTrainedModel, tokens: Sequence[int]
) -> tuple[SequenceCache, int]:
    """The session's cache rolled back to what it shares with `tokens`, and how many positions it kept.

    At least the last token is left out of the kept prefix: its logits are the ones the caller
    needs. A session that is unknown, or whose cache cannot roll back that far, starts afresh
    (a cache miss costs a prefill, never a wrong answer).
    """
    session = sessions.get(session_id)
    if session is not None:
        keep = min(common_prefix(session.tokens, tokens), len(tokens) - 1)
        try:
            rollback(session.cache, len(session.tokens) - keep)
            del session.tokens[keep:]
            return session, keep
        except RollbackError:
            pass
    session = sessions[session_id] = SequenceCache(new_cache(model))
    return session, 0
