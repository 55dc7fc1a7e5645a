"""The draft tier: drafters (n-gram lookup, suffix decoding, a draft model, hybrids) behind one `Drafter`
contract and the batching DraftCore, served over gRPC (DraftService) by DraftServer."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "DraftCore": "service",
    "DraftConfig": "service",
    "DraftServer": "server",
    "Drafter": "drafter",
    "DraftRequest": "drafter",
    "build_drafter": "registry",
    "NgramDrafter": "ngram",
    "ModelDrafter": "model_drafter",
    "HybridDrafter": "hybrid",
    "SuffixDrafter": "suffix",
    "SuffixConfig": "suffix",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
