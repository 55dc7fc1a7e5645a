"""Capacity planning: `specdec plan` sizes the target and draft tiers for a load from measured
costs (capacity), calibrates the round overhead from the stack's tokens/s (calibrate), and checks
a plan by a discrete-event simulation (simulate; docs/planning.md)."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "CapacityPlan": "capacity",
    "Costs": "capacity",
    "PlanConfig": "capacity",
    "PlanError": "capacity",
    "closed_loop_tokens_per_s": "capacity",
    "load_costs": "capacity",
    "overhead_line": "calibrate",
    "plan": "capacity",
    "report": "capacity",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
