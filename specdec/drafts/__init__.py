"""Draft making and naming a draft: `load_model(spec)` (the runtime loader with the draft formats),
drafts cut from their target (first layers, pruned vocabularies) and the shipped draft."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "load_model": "loading",
    "load_tokenizer": "loading",
    "prepare": "loading",
    "first_layers_dir": "truncate",
    "build_pruned_draft": "pruned_draft",
    "save_pruned_draft": "pruned_draft",
    "resolve_drafter": "shipped_draft",
    "DISTILLED": "shipped_draft",
    "AUTO": "shipped_draft",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
