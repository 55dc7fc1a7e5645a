"""The target tier: the scheduler (admission, token budget, chunking, preemption: a named plan
per pass), the verifier (runs a plan in one batched target pass and applies the acceptance rule),
the Ray actor that serves it, and the pool that places sessions on actors and resends a lost
context."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "TargetVerifier": "verifier",
    "Scheduler": "scheduler",
    "PassPlan": "scheduler",
    "TargetActor": "actor",
    "ActorConfig": "actor",
    "TargetPool": "pool",
    "PoolConfig": "pool",
    "TargetUnavailable": "pool",
    "TargetOverloaded": "pool",
    "launch": "pool",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
