"""The one entry point for naming a model anywhere: `load_model(spec)`, `load_tokenizer(spec)`,
`prepare(spec)`.

A model spec is a checkpoint spec (`specdec.runtime.models`: the embedded default, a directory,
a .gguf file, a hub id) or a draft spec: a pruned draft directory (`draft.json`, assembled from
its target: `pruned_draft`) or "distilled", the pruned draft shipped for the embedded target
(`shipped_draft`).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from specdec.drafts import pruned_draft
from specdec.drafts.shipped_draft import resolve_model
from specdec.runtime.models import LoadedModel, load_checkpoint, load_checkpoint_tokenizer, prepare_checkpoint


def load_model(
    spec: str | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    pack: bool = True,
) -> LoadedModel:
    """Load the model and tokenizer `spec` names. `pack=False` leaves oneDNN's packed weight
    copies to be made later (for a model about to be cut down)."""
    spec = resolve_model(spec)
    if pruned_draft.is_pruned_draft_dir(spec):  # a draft stored as its differences from a target
        return pruned_draft.load_pruned_draft(spec, dtype=dtype, device=device)
    return load_checkpoint(spec, dtype=dtype, device=device, pack=pack)


def prepare(spec: str | None = None) -> None:
    """Do the one-time work of loading `spec` now, so processes started next all find the cache
    instead of each converting it at once. A pruned draft's work is its target's."""
    prepare_checkpoint(_checkpoint_of(spec))


def load_tokenizer(spec: str | None = None) -> PreTrainedTokenizerBase:
    """Only the tokenizer of `spec`. A pruned draft ships none: its target's is its own."""
    return load_checkpoint_tokenizer(_checkpoint_of(spec))


def _checkpoint_of(spec: str | None) -> str | None:
    """The checkpoint spec behind `spec`: a pruned draft's target, else `spec` itself."""
    spec = resolve_model(spec)
    return pruned_draft.target_spec(spec) if pruned_draft.is_pruned_draft_dir(spec) else spec
