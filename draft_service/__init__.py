"""The draft tier: drafters (n-gram lookup, a draft model, the hybrid of both) behind the batching
DraftCore, served over gRPC (DraftService) by DraftServer."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "DraftCore": "service",
    "DraftConfig": "service",
    "DraftServer": "server",
    "NgramDrafter": "ngram",
    "ModelDrafter": "model_drafter",
    "HybridDrafter": "hybrid",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
