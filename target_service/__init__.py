"""The target tier: the scheduler (admission, token budget, chunking, preemption: a `PassPlan`
per pass), the verifier (runs it in one batched target pass, applies the acceptance rule and
answers each round by its item: `PassResults`), the Ray actor that serves it, and the pool that
places sessions on actors and resends a lost context."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "TargetVerifier": "verifier",
    "Scheduler": "scheduler",
    "PassPlan": "scheduler",
    "PassResults": "verifier",
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
