"""The `specdec` command: the local stack, generate, trace, and the delegated tier commands; and
the flags made from config dataclasses (`config_flags`) with their value types (`flag_types`)."""

from specdec._exports import lazy_exports

_EXPORTS = {"main": "app"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
