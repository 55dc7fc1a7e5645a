"""Slow parts: a draft that answers late, a draft server that stops answering, a target that
stalls. Speculation is an optimisation, so a late draft must cost at most its timeout per round
and never the request's tokens; a stalled target costs time, and the call's deadline bounds it.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from contextlib import contextmanager

import grpc
import pytest
from stackkit import REQUESTS, TTL_S, Stack, Streams, assert_same_output, percentile

from specdec.coordinator.engine import EngineConfig

ENGINE = EngineConfig(draft_timeout_s=0.25, draft_retry_s=0.5)
# What a round may take beyond its draft budget on 2 shared cores (a verify of six sessions, the
# stream's write, scheduling); the p99 of an unfaulted gap is well under this.
SLACK_S = 0.5


@pytest.fixture(scope="module")
def stack(fault_tiers):
    s = Stack(fault_tiers, ENGINE)
    yield s
    s.close()


@pytest.fixture
def expected(fault_expected):
    return fault_expected


class Late:
    """A proposer that answers every call `delay_s` late, ending sessions included."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    async def propose(self, session_id, tokens, k, sampling, model_k=None, affinity="", tree=False):
        await asyncio.sleep(self.delay_s)
        return await self.inner.propose(session_id, tokens, k, sampling, model_k, affinity, tree)

    async def end_session(self, session_id, completion=()):
        await asyncio.sleep(self.delay_s)
        await self.inner.end_session(session_id)


@contextmanager
def proposer(stack: Stack, make):
    engine = stack.coordinator.engine
    real = engine.proposer
    engine.proposer = make(real)
    try:
        yield
    finally:
        engine.proposer = real


def _assert_latency_bounded(outcomes, round_budget_s: float, label: str) -> None:
    """p99 of the time between a stream's messages (the first one, and the status after the
    last, included) within a round's budget plus slack: a slow draft costs at most its timeout."""
    gaps = [gap for o in outcomes for gap in o.gaps()]
    assert percentile(gaps, 0.99) < round_budget_s + SLACK_S, sorted(gaps)[-5:]
    # The status comes right after the last message: cleanup on a slow tier does not hold the call.
    last = max(o.gaps()[-1] for o in outcomes)
    assert last < ENGINE.draft_timeout_s + SLACK_S
    print(
        f"\n{label}: {len(outcomes)} streams as unfaulted; "
        f"gaps p50 {percentile(gaps, 0.5) * 1e3:.0f} ms, p99 {percentile(gaps, 0.99) * 1e3:.0f} ms, "
        f"max {max(gaps) * 1e3:.0f} ms; last message to status at most {last * 1e3:.0f} ms; "
        f"draft failures {sum(o.final.speculation.draft_failures for o in outcomes)}"
    )


def test_late_draft_falls_back_without_changing_tokens(stack, expected):
    with proposer(stack, lambda real: Late(real, delay_s=4 * ENGINE.draft_timeout_s)):
        outcomes = Streams(stack.coordinator.address, REQUESTS).start().join()
    assert_same_output(outcomes, expected)
    for o in outcomes:
        stats = o.final.speculation
        assert stats.draft_tokens == 0 and stats.non_speculative_rounds == stats.rounds  # every proposal came too late
        assert stats.draft_failures >= 1
    _assert_latency_bounded(outcomes, ENGINE.draft_timeout_s, "late draft")
    stack.assert_clean()


@pytest.mark.long  # the late proposer above covers the fallback; this adds a real stopped process and the TTL
def test_draft_server_that_stops_answering(stack, expected):
    """SIGSTOP the draft server mid-stream: its connections stay open and nothing answers, so
    every call waits for its timeout; the streams end while it is still stopped."""
    streams = Streams(stack.coordinator.address, REQUESTS).start()
    streams.wait_messages(3)
    stack.tiers.draft.signal(signal.SIGSTOP)
    try:
        outcomes = streams.join()
    finally:
        stack.tiers.draft.signal(signal.SIGCONT)
    assert_same_output(outcomes, expected)
    assert all(o.final.speculation.draft_failures >= 1 for o in outcomes)
    _assert_latency_bounded(outcomes, ENGINE.draft_timeout_s, "draft server SIGSTOP")
    stack.assert_clean(TTL_S + 10)  # the sessions end late, or by TTL
    stack.coordinator.draft_ready()
    again = Streams(stack.coordinator.address, REQUESTS).start().join()
    assert_same_output(again, expected)
    assert all(o.final.speculation.draft_tokens > 0 for o in again)  # it answers again: speculation is back


def test_stalled_target_deadlines_hold(stack, expected):
    """SIGSTOP the target actor for STALL_S while streams run and more arrive with a short
    deadline: those end DEADLINE_EXCEEDED on time, the others finish with their tokens once the
    actor resumes, and the stall is the only latency they see."""
    stall_s, deadline_s = 2.0, 0.75
    pid = stack.tiers.actor_info()["pid"]
    streams = Streams(stack.coordinator.address, REQUESTS).start()
    streams.wait_messages(3)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        short = Streams(stack.coordinator.address, REQUESTS, timeout_s=deadline_s).start()
        cut = short.join(deadline_s + 5)
        time.sleep(max(stall_s - (time.monotonic() - stopped), 0))  # the fault lasts stall_s: nothing to wait for
    finally:
        os.kill(pid, signal.SIGCONT)
    for o, e in zip(cut, expected):
        assert o.code == grpc.StatusCode.DEADLINE_EXCEEDED, (o.code, o.details)
        assert o.ended - o.started < deadline_s + SLACK_S
        assert o.tokens == e.tokens[: len(o.tokens)]
    outcomes = streams.join()
    assert_same_output(outcomes, expected)
    gaps = [gap for o in outcomes for gap in o.gaps()]
    assert stall_s * 0.9 < max(gaps) < stall_s + SLACK_S + 1.0  # the stall, and nothing more
    released = stack.assert_clean()
    print(
        f"\ntarget SIGSTOP {stall_s} s: {len(cut)} calls DEADLINE_EXCEEDED "
        f"after at most {max(o.ended - o.started for o in cut) * 1e3:.0f} ms "
        f"(deadline {deadline_s * 1e3:.0f} ms); {len(outcomes)} streams as unfaulted, longest gap {max(gaps):.2f} s; "
        f"coordinator and tiers clean {released:.1f} s after the last stream"
    )


class Jittery:
    """A proposer whose every answer is late by a random delay around the timeout: some make it,
    some do not (a draft tier near saturation)."""

    def __init__(self, inner, seed: int):
        self.inner, self.random = inner, random.Random(seed)

    async def propose(self, session_id, tokens, k, sampling, model_k=None, affinity="", tree=False):
        await asyncio.sleep(self.random.uniform(0.0, 2 * ENGINE.draft_timeout_s))
        return await self.inner.propose(session_id, tokens, k, sampling, model_k, affinity, tree)

    async def end_session(self, session_id, completion=()):
        await asyncio.sleep(self.random.uniform(0.0, 2 * ENGINE.draft_timeout_s))
        await self.inner.end_session(session_id)


@pytest.mark.long
def test_jittery_draft_for_half_a_minute(stack, expected):
    """Waves of streams for half a minute over a draft whose latency straddles the timeout: the
    tokens never change, speculation and fallback both happen, and p99 stays within a round's budget."""
    waves, outcomes = 0, []
    stop_at = time.monotonic() + 30
    with proposer(stack, lambda real: Jittery(real, seed=7)):
        while time.monotonic() < stop_at:
            wave = Streams(stack.coordinator.address, REQUESTS).start().join()
            assert_same_output(wave, expected)
            outcomes += wave
            waves += 1
    stats = [o.final.speculation for o in outcomes]
    assert sum(s.draft_failures for s in stats) > 0 and sum(s.accepted_tokens for s in stats) > 0
    _assert_latency_bounded(outcomes, ENGINE.draft_timeout_s, "jittery draft")
    stack.assert_clean()
    gaps = [gap for o in outcomes for gap in o.gaps()]
    print(
        f"\n{waves} waves, {len(outcomes)} streams, {len(gaps)} gaps: "
        f"p50 {percentile(gaps, 0.5) * 1e3:.0f} ms, p99 {percentile(gaps, 0.99) * 1e3:.0f} ms"
    )
