"""The model runtime: checkpoint loading, per-session KV caches, the batched forward and the
CPU kernels, and tiny random models for tests."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "LoadedModel": "models",
    "load_checkpoint": "models",
    "load_checkpoint_tokenizer": "models",
    "prepare_checkpoint": "models",
    "cache_dir": "models",
    "SequenceCache": "kv_cache",
    "rollback": "kv_cache",
    "batched_forward": "batching",
    "make_tiny_model": "tiny",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
