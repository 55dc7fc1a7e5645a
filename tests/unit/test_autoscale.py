"""The target pool's size policy (target_service/autoscale.py) driven by recorded load series:
it grows, holds and shrinks, and a noisy series around a mark does not flap."""

from __future__ import annotations

import itertools

import pytest

from specdec.target_service.autoscale import AutoscaleConfig, Autoscaler, PoolSignals, signals_from

TICK = 10.0  # the keeper's --keep in the manifests
CONFIG = AutoscaleConfig(autoscale=True, min_replicas=1, max_replicas=4)  # the other fields at their defaults
# Deterministic jitter, as a scrape of a live pool shows it: KV use +-0.04, queued +-1.
JITTER = [(0.02, 1), (-0.04, -1), (0.04, 0), (-0.01, 1), (0.0, -1), (-0.03, 0), (0.03, 1), (-0.02, -1)]


def recorded(phases: list[tuple[float, float, float]], start: float = 0.0) -> list[tuple[float, PoolSignals]]:
    """(time, signals) every TICK seconds: each phase is (seconds, KV use, queued per actor), with JITTER."""
    samples, t, jitter = [], start, itertools.cycle(JITTER)
    for seconds, kv, queued in phases:
        for _ in range(int(seconds / TICK)):
            dkv, dq = next(jitter)
            samples.append((t, PoolSignals(2, min(1.0, max(0.0, kv + dkv)), max(0.0, queued + dq))))
            t += TICK
    return samples


def changes(scaler: Autoscaler, samples: list[tuple[float, PoolSignals]]) -> list[tuple[float, int]]:
    """(time, new size) at every change of the desired size."""
    found, size = [], scaler.desired
    for t, signals in samples:
        desired = scaler.observe(t, signals)
        if desired != size:
            found.append((t, desired))
            size = desired
    return found


def test_grows_holds_and_shrinks_on_a_recorded_series():
    series = recorded(
        [
            (300, 0.50, 1.0),  # steady, inside the band: hold at 2
            (600, 0.90, 6.0),  # KV above 0.8 and 6 queued per actor: grow to the max, a step per cool-down
            (600, 0.60, 2.0),  # back inside the band: hold at the max
            (900, 0.10, 0.0),  # idle: shrink one actor per cool-down to the min
        ]
    )
    found = changes(Autoscaler(CONFIG, replicas=2), series)
    assert [size for _, size in found] == [3, 4, 3, 2, 1]
    times = [t for t, _ in found]
    assert 300 < times[0] <= 300 + CONFIG.window_s  # reacts within a window of the load arriving
    assert all(b - a >= CONFIG.cooldown_s for a, b in zip(times, times[1:])), times
    assert all(t < 900 for t in times[:2]) and all(t >= 1500 for t in times[2:]), "nothing changes while in the band"


@pytest.mark.parametrize(
    "kv, queued, why",
    [
        ((0.74, 0.84), (1.0, 1.0), "KV use alternates across the high mark 0.8 (mean 0.79)"),
        ((0.27, 0.35), (0.0, 0.0), "KV use alternates across the low mark 0.3 (mean 0.31)"),
        ((0.50, 0.50), (3.0, 7.0), "queued rounds alternate across the high mark 5 (mean 5)"),
        ((0.70, 0.70, 0.70, 0.70, 0.70, 0.95), (1.0,) * 6, "a one-tick spike above 0.8 every minute"),
    ],
)
def test_a_noisy_series_around_a_mark_does_not_flap(kv, queued, why):
    n = 12 * 60 // int(TICK)  # an hour of ticks would do the same: the window's mean never crosses a mark
    series = [(i * TICK, PoolSignals(3, kv[i % len(kv)], queued[i % len(queued)])) for i in range(n)]
    scaler = Autoscaler(CONFIG, replicas=3)
    assert changes(scaler, series) == [], why
    for t, signals in series:  # every tick's own reading crosses a mark (but the spike's baseline)
        assert scaler.observe(t, signals) == 3


def test_closed_loop_settles_without_reversals():
    """Load spread over the actors the policy asks for (demand in actor-loads: KV use per actor is
    demand / size, queued rounds 2 x demand / size): the size follows a ramp up and down in as
    many steps as it needs, and never turns back while the demand holds still."""
    scaler = Autoscaler(CONFIG, replicas=1)
    demand = [0.6] * 60 + [2.0] * 120 + [3.0] * 120 + [0.3] * 180  # ticks of 10 s
    sizes, jitter = [], itertools.cycle(JITTER)
    for i, d in enumerate(demand):
        n = scaler.desired
        dkv, dq = next(jitter)
        sizes.append(scaler.observe(i * TICK, PoolSignals(n, min(1.0, d / n + dkv), max(0.0, 2 * d / n + dq / 4))))
    steps = [(i, b) for i, (a, b) in enumerate(zip(sizes, sizes[1:]), 1) if a != b]
    assert sizes[59] == 1 and sizes[179] == 3 and sizes[299] == 4 and sizes[-1] == 1, steps
    for lo, hi in ((60, 180), (180, 300), (300, 480)):  # inside one demand level: one direction only
        moves = [b - sizes[i - 1] for i, b in steps if lo <= i < hi]
        assert all(m > 0 for m in moves) or all(m < 0 for m in moves), (lo, steps)
    assert len(steps) <= 6, steps


def test_bounds_and_start():
    assert Autoscaler(CONFIG, replicas=9).desired == 4 and Autoscaler(CONFIG, replicas=0).desired == 1
    scaler = Autoscaler(CONFIG, replicas=4)
    assert changes(scaler, recorded([(600, 1.0, 50.0)])) == []  # at the max already
    scaler = Autoscaler(AutoscaleConfig(min_replicas=2, max_replicas=4), replicas=2)
    assert changes(scaler, recorded([(900, 0.0, 0.0)])) == []  # at the min already
    assert scaler.observe(1e6, None) == 2  # no reading: no change


def test_a_big_jump_grows_in_one_step_to_where_the_signal_would_be_back_at_its_mark():
    scaler = Autoscaler(AutoscaleConfig(min_replicas=1, max_replicas=16), replicas=2)
    flat = [(i * TICK, PoolSignals(2, 0.5, 20.0)) for i in range(8)]  # 20 queued per actor: 4x the mark
    assert changes(scaler, flat) == [(60.0, 8)]


def test_signals_from_actor_loads():
    loads = [
        {"queued": 4, "running": 8, "sessions": 10, "kv_blocks_used": 90, "kv_blocks_total": 100, "draining": False},
        {"queued": 2, "running": 8, "sessions": 10, "kv_blocks_used": 50, "kv_blocks_total": 100, "draining": False},
        {"queued": 9, "running": 0, "sessions": 0, "kv_blocks_used": 0, "kv_blocks_total": 100, "draining": True},
    ]
    assert signals_from(loads) == PoolSignals(2, pytest.approx(0.7), 3.0)  # the draining actor counts no more
    assert signals_from(loads[2:]) is None


def test_marks_that_cannot_work_are_refused():
    assert AutoscaleConfig().problems() == []
    assert len(AutoscaleConfig(min_replicas=5, max_replicas=2, kv_low=0.9, queue_low=6).problems()) == 3
