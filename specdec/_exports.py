"""Public faces without import cost: a package lists what its callers use, and each name is
imported from its module on first use, so `import specdec.cli.config_flags` does not load torch
and `specdec generate` does not load transformers."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The package's module `__getattr__`: `exports` maps each public name to its submodule."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
