"""The one model loader, for targets and drafts alike: `load_model(spec)`, `load_tokenizer(spec)`,
`prepare(spec)`.

A spec is a checkpoint spec (`models.py`: the embedded default, a directory, a .gguf file, a hub
id) unless one of the `formats` the caller passes recognises it. A format stores a model the
runtime cannot read alone: the drafts package passes its own (a pruned draft directory, built
from its target at load time: `specdec.drafts.loading`). A target's load passes none, so it never
asks a directory whether it is a draft, nor imports the drafts package. The formats are an
argument, not a registry filled at import, so what a spec loads as never depends on what the
process happened to import first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from specdec.runtime.models import LoadedModel, load_checkpoint, load_checkpoint_tokenizer, prepare_checkpoint


@dataclass(frozen=True)
class ModelFormat:
    """A way of storing a model beyond a checkpoint: how to tell a spec of it and read it."""

    recognises: Callable[[str | None], bool]  # spec -> stored in this format
    load: Callable[..., LoadedModel]  # (spec, *, dtype, device) -> the model, packed
    checkpoint_of: Callable[[str | None], str | None]  # spec -> the checkpoint holding its tokenizer


def load_model(
    spec: str | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    pack: bool = True,
    formats: Sequence[ModelFormat] = (),
) -> LoadedModel:
    """Load the model and tokenizer `spec` names. `pack=False` leaves oneDNN's packed weight
    copies to be made later (for a model about to be cut down)."""
    form = _format_of(spec, formats)
    if form is not None:
        return form.load(spec, dtype=dtype, device=device)
    return load_checkpoint(spec, dtype=dtype, device=device, pack=pack)


def prepare(spec: str | None = None, *, formats: Sequence[ModelFormat] = ()) -> None:
    """Do the one-time work of loading `spec` now, so processes started next all find the cache
    instead of each converting it at once. A format's work is its checkpoint's."""
    prepare_checkpoint(_checkpoint_of(spec, formats))


def load_tokenizer(spec: str | None = None, *, formats: Sequence[ModelFormat] = ()) -> PreTrainedTokenizerBase:
    """Only the tokenizer of `spec` (the coordinator tokenizes, it holds no weights)."""
    return load_checkpoint_tokenizer(_checkpoint_of(spec, formats))


def _format_of(spec: str | None, formats: Sequence[ModelFormat]) -> ModelFormat | None:
    return next((form for form in formats if form.recognises(spec)), None)


def _checkpoint_of(spec: str | None, formats: Sequence[ModelFormat]) -> str | None:
    form = _format_of(spec, formats)
    return spec if form is None else form.checkpoint_of(spec)
