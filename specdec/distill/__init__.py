"""Distillation: `specdec distill-draft` trains a small pruned-vocabulary draft on a target's
own outputs (train), from a text corpus (data) and the target's generated continuations
(generate)."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "DistillConfig": "train",
    "distill": "train",
    "main": "train",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
