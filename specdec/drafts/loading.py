"""Naming a draft: `load_model(spec)`, `load_tokenizer(spec)`, `prepare(spec)` with the draft
formats the runtime loader (`specdec.runtime.loading`) does not know.

A draft spec is a checkpoint spec, a pruned draft directory (`draft.json`, assembled from its
target: `pruned_draft`) or "distilled", the pruned draft shipped for the embedded target
(`shipped_draft`). Targets load through the runtime loader directly.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from specdec.drafts import pruned_draft
from specdec.drafts.shipped_draft import resolve_model
from specdec.runtime import loading
from specdec.runtime.loading import ModelFormat
from specdec.runtime.models import LoadedModel

# A draft stored as its differences from a target; its tokenizer and conversion are the target's.
PRUNED_DRAFT = ModelFormat(
    recognises=pruned_draft.is_pruned_draft_dir,
    load=pruned_draft.load_pruned_draft,
    checkpoint_of=pruned_draft.target_spec,
)
FORMATS = (PRUNED_DRAFT,)


def load_model(
    spec: str | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    pack: bool = True,
) -> LoadedModel:
    """Load the draft and tokenizer `spec` names. `pack=False` leaves oneDNN's packed weight
    copies to be made later (for a model about to be cut down)."""
    return loading.load_model(resolve_model(spec), dtype=dtype, device=device, pack=pack, formats=FORMATS)


def prepare(spec: str | None = None) -> None:
    """`specdec.runtime.loading.prepare` for a draft spec: a pruned draft's work is its target's."""
    loading.prepare(resolve_model(spec), formats=FORMATS)


def load_tokenizer(spec: str | None = None) -> PreTrainedTokenizerBase:
    """Only the tokenizer of `spec`. A pruned draft ships none: its target's is its own."""
    return loading.load_tokenizer(resolve_model(spec), formats=FORMATS)
