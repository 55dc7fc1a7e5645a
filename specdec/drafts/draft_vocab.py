"""The draft's pruned vocabulary: the tokens that cover most of what the target predicts.

FR-Spec (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling") drafts over the most frequent tokens only: for Gemma 3
270M the 262,144 x 640 output projection (671 MB of fp32 weights, read every step) is a large
share of a decode step, and a draft restricted to 32,768 tokens pays an eighth of that. A draft
token outside the subset can never be proposed, so coverage (the share of target predictions
inside it) bounds acceptance.

We rank by counts of what the target predicts (its argmax, or its top-k) on the training text,
plus the text's own token counts as a tie-breaker and a fallback for tokens the sample never
reached. Special tokens and every EOS id are always kept: a draft that cannot propose the end of
a turn would have every final round rejected.

The choice is stored as a sorted JSON list of token ids (vocab.json): readable, diffable, and all
that is needed to rebuild the draft's embedding and output rows from the target's at load time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

VOCAB_FILE = "vocab.json"


def count_tokens(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each id occurs in `token_ids` (any shape) -> (vocab_size,) int64."""
    return torch.bincount(token_ids.reshape(-1).long(), minlength=vocab_size)[:vocab_size]


def count_predictions(logits: torch.Tensor, top_k: int = 1) -> torch.Tensor:
    """How often each id is among the target's top-k predictions, logits (..., vocab) -> (vocab,)."""
    vocab = logits.shape[-1]
    top = torch.topk(logits.reshape(-1, vocab), top_k, dim=-1).indices  # (positions, top_k)
    return count_tokens(top, vocab)


def choose_vocab(
    prediction_counts: torch.Tensor,
    size: int,
    always: Iterable[int] = (),
    text_counts: torch.Tensor | None = None,
) -> list[int]:
    """The `size` ids ranked first by prediction count, then text count, then id; `always` first.

    prediction_counts, text_counts: (vocab,). Returns a sorted list of distinct ids. Sorted, so the
    draft's logit column j is token ids[j] and the mapping back is one gather.
    """
    vocab = prediction_counts.shape[0]
    always = sorted({int(t) for t in always if 0 <= int(t) < vocab})
    if not len(always) <= size <= vocab:
        raise ValueError(f"vocab size must be in [{len(always)}, {vocab}], got {size}")
    # One float64 key per id: predictions dominate, text counts break ties, a smaller id last.
    # float64 holds integers exactly up to 2^53; prediction counts times 2^24 stay far below that
    # for any corpus we count (text counts are capped just under 2^24 so they never carry over).
    key = prediction_counts.double() * 2.0**24
    if text_counts is not None:
        key = key + text_counts.double().clamp(max=2.0**24 - 1)
    key[always] = float("inf")
    order = torch.sort(-key, stable=True).indices  # key descending; stable: ties by id ascending
    return sorted(order[:size].tolist())


def coverage(vocab_ids: Iterable[int], prediction_counts: torch.Tensor) -> float:
    """Share of the counted predictions that fall inside the vocabulary (an upper bound on the
    greedy acceptance of any draft restricted to it)."""
    total = float(prediction_counts.sum())
    if total == 0:
        return 0.0
    return float(prediction_counts[torch.tensor(list(vocab_ids), dtype=torch.long)].sum()) / total


def special_ids(tokenizer, eos_token_ids: Iterable[int]) -> set[int]:
    """Every id the tokenizer calls special, plus the model's EOS ids."""
    ids = {int(t) for t in eos_token_ids}
    ids.update(int(t) for t in getattr(tokenizer, "all_special_ids", []) if t is not None)
    return ids


def save_vocab(directory: Path, ids: list[int]) -> Path:
    path = Path(directory) / VOCAB_FILE
    path.write_text(json.dumps(sorted(ids)))
    return path


def load_vocab(directory: Path) -> list[int]:
    ids = json.loads((Path(directory) / VOCAB_FILE).read_text())
    if (
        not isinstance(ids, list)
        or not ids
        or ids != sorted(set(ids))
        or not all(isinstance(t, int) and t >= 0 for t in ids)
    ):
        raise ValueError(f"{directory}/{VOCAB_FILE}: expected a sorted list of distinct token ids")
    return ids
