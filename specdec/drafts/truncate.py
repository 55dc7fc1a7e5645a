"""A draft cut from its target: the target's embedding, its first layers and its final norm.

It shares the target's tokenizer and vocabulary, so it can draft for any target with no
training at all (an early exit after `num_layers` layers: a weak but honest draft), and it is
the starting point a distilled draft is trained from. The result is an ordinary
`save_pretrained` directory, cached under `cache_dir()/drafts`, that every loader, the draft
server included, opens like any other model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from specdec.runtime.loading import load_model
from specdec.runtime.models import build_atomically, cache_dir


def first_layers_dir(target_spec: str | None, num_layers: int) -> Path:
    """The cached directory of the target's first `num_layers` layers, built on first use."""
    key = hashlib.sha256(f"{target_spec}|{num_layers}".encode()).hexdigest()[:12]
    stem = "embedded" if target_spec in (None, "default") else Path(str(target_spec)).name
    out = cache_dir() / "drafts" / f"{stem}-first{num_layers}-{key}"
    if not out.is_dir():
        build_atomically(out, lambda scratch: _save_first_layers(target_spec, num_layers, scratch / "model"))
    return out


def _save_first_layers(target_spec: str | None, num_layers: int, out: Path) -> None:
    loaded = load_model(target_spec)
    keep_first_layers(loaded.model, num_layers)
    loaded.model.save_pretrained(out)
    loaded.tokenizer.save_pretrained(out)


def keep_first_layers(model: torch.nn.Module, num_layers: int) -> None:
    """Cut `model`, in place, to its first `num_layers` decoder layers, and its config with it."""
    layers = _decoder_layers(model)
    if not 1 <= num_layers <= len(layers):
        raise ValueError(f"num_layers must be in [1, {len(layers)}] for this target, got {num_layers}")
    del layers[num_layers:]
    config = model.config.get_text_config()
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):  # per-layer attention kinds (Gemma 3: sliding or full)
        config.layer_types = config.layer_types[:num_layers]


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's stack of decoder layers (`model.layers`, `transformer.h`, ...)."""
    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise ValueError(f"{type(model).__name__}: no list of {n} decoder layers found")
