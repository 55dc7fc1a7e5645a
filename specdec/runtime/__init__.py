"""The model runtime: the one model loader, the KV block pool, the ragged batched forward with
paged attention, and the CPU kernels."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "LoadedModel": "models",
    "ModelFormat": "loading",
    "load_model": "loading",
    "load_tokenizer": "loading",
    "prepare": "loading",
    "load_checkpoint": "models",
    "load_checkpoint_tokenizer": "models",
    "prepare_checkpoint": "models",
    "cache_dir": "models",
    "KVBlockPool": "kv_pool",
    "PagedSession": "kv_pool",
    "ragged_forward": "ragged",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
