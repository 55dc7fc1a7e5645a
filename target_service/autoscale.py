"""The target pool's desired size from its own load: KV cache use and queued verify rounds.

The signals are what every actor reports (`TargetActor.load`): the share of its KV blocks in use
and the rounds queued for its next pass, averaged over the actors that still take rounds. The
thresholds follow llm-d's autoscaler (saturated at KV use 0.8 or 5 queued requests) and vLLM's
production stack (KEDA at 5 waiting requests).

The rule, checked at every keeper tick over the mean of the readings of the last `window_s`:
- grow when KV use is above `kv_high` or queued rounds per actor above `queue_high`, to the size
  that brings the signal back to its mark (HPA's `ceil(n * value / target)`), at least one more;
- shrink by one when KV use is below `kv_low` and queued rounds below `queue_low`;
- otherwise hold: the band between the marks is the hysteresis;
- no change within `cooldown_s` of the last one, and none before a full window of readings taken
  since it (readings from before a change describe another pool size);
- always within [min_replicas, max_replicas].
Shrinking one actor at a time keeps each step's load rise small (n / (n - 1)): with `kv_low`
below `kv_high / 2` even the 2 -> 1 step lands inside the band. The keeper drains an actor (its
sessions move with their context) before it removes it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from specdec.core.settings import setting


@dataclass(frozen=True)
class AutoscaleConfig:
    """What `specdec target --keep` sizes the pool by when `--autoscale on`."""

    autoscale: bool = setting(
        False, "'on': with --keep, size the pool from its load within --min/--max-replicas; 'off': fixed at --replicas"
    )
    min_replicas: int = setting(1, "with --autoscale: the fewest actors", type="positive_int")
    max_replicas: int = setting(
        4, "with --autoscale: the most actors (at most the Ray worker group's)", type="positive_int"
    )
    kv_high: float = setting(0.8, "grow above this mean share of KV blocks in use (llm-d's 0.8)")
    kv_low: float = setting(0.3, "shrink below this mean share of KV blocks in use (and --queue-low)")
    queue_high: float = setting(5.0, "grow above this many queued rounds per actor (vLLM's and llm-d's 5)")
    queue_low: float = setting(0.5, "shrink below this many queued rounds per actor (and --kv-low)")
    window_s: float = setting(
        60.0, "decide on the mean of this many seconds of readings", flag="scale-window", type="positive_seconds"
    )
    cooldown_s: float = setting(
        180.0, "no change within this many seconds of the last one", flag="scale-cooldown", type="seconds"
    )

    def problems(self) -> list[str]:
        """What makes the marks unusable (empty: none)."""
        found = []
        if self.min_replicas > self.max_replicas:
            found.append(f"--min-replicas {self.min_replicas} > --max-replicas {self.max_replicas}")
        if not 0.0 <= self.kv_low < self.kv_high <= 1.0:
            found.append(f"need 0 <= --kv-low < --kv-high <= 1, got {self.kv_low} and {self.kv_high}")
        if not 0.0 <= self.queue_low < self.queue_high:
            found.append(f"need 0 <= --queue-low < --queue-high, got {self.queue_low} and {self.queue_high}")
        return found


@dataclass(frozen=True)
class PoolSignals:
    """One reading of the pool's load, averaged over the actors that take rounds."""

    actors: int  # actors that answered and are not draining
    kv_usage: float  # KV blocks in use / KV blocks, 0..1
    queued: float  # rounds waiting for a pass, per actor


def signals_from(loads: list[dict]) -> PoolSignals | None:
    """The pool's reading from its actors' `load()` dicts (None when no actor takes rounds)."""
    live = [load for load in loads if not load.get("draining")]
    if not live:
        return None
    kv = [load["kv_blocks_used"] / max(1, load["kv_blocks_total"]) for load in live]
    return PoolSignals(len(live), sum(kv) / len(live), sum(load["queued"] for load in live) / len(live))


class Autoscaler:
    """The desired pool size, fed one reading per keeper tick (`observe`)."""

    def __init__(self, config: AutoscaleConfig, replicas: int):
        self.config = config
        self.desired = min(max(replicas, config.min_replicas), config.max_replicas)
        self._readings: deque[tuple[float, PoolSignals]] = deque()
        self._since: float | None = None  # when readings at the current size began
        self._changed: float = -math.inf

    def observe(self, now: float, signals: PoolSignals | None) -> int:
        """Take the reading at time `now` (seconds, any monotonic clock); returns the desired size."""
        c = self.config
        if signals is None:
            return self.desired
        if self._since is None:
            self._since = now
        self._readings.append((now, signals))
        while self._readings[0][0] <= now - c.window_s:  # the window is (now - window_s, now]
            self._readings.popleft()
        if now - self._since < c.window_s or now - self._changed < c.cooldown_s:
            return self.desired
        kv = sum(s.kv_usage for _, s in self._readings) / len(self._readings)
        queued = sum(s.queued for _, s in self._readings) / len(self._readings)
        n = self.desired
        if kv > c.kv_high or queued > c.queue_high:
            want = max(n + 1, math.ceil(n * max(kv / c.kv_high, queued / c.queue_high)))
        elif kv < c.kv_low and queued < c.queue_low:
            want = n - 1
        else:
            want = n
        want = min(max(want, c.min_replicas), c.max_replicas)
        if want != n:
            self.desired, self._changed, self._since = want, now, None
            self._readings.clear()
        return self.desired
