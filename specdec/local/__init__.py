"""The whole system on one machine: the local stack of `specdec up` and `specdec demo` (a draft
server, a target pool on a local Ray, the coordinator), and the in-process engine of
`--in-process` and the tests (draft, target and engine in one process)."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "LocalStack": "stack",
    "StackConfig": "stack",
    "build_engine": "in_process",
    "load_pair": "in_process",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
