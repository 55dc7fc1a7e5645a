"""A call's deadline bounds its generation, not the sessions' cleanup after the last token."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from specdec.coordinator.calls import CallFailed, Calls, CallSpan
from specdec.coordinator.engine import Delta, FinishReason, GenerationRequest, SpeculationStats


class _Engine:
    """Gives a token, sleeps `before_final_s`, gives the final delta; ending its sessions (its
    `finally`) takes `cleanup_s`. Records whether the cleanup ran to its end or was cut."""

    def __init__(self, before_final_s: float, cleanup_s: float):
        self.before_final_s, self.cleanup_s = before_final_s, cleanup_s
        self.cleaned = self.cut = False

    async def stream(self, request):
        try:
            yield Delta([5], "a")
            await asyncio.sleep(self.before_final_s)
            yield Delta([6], "b", FinishReason.LENGTH, 1, SpeculationStats())
        finally:
            try:
                await asyncio.sleep(self.cleanup_s)
                self.cleaned = True
            except asyncio.CancelledError:
                self.cut = True
                raise


def _call(engine: _Engine, timeout_s: float) -> tuple[list[Delta], object]:
    deltas: list[Delta] = []

    async def on_delta(delta, trace_id):
        deltas.append(delta)

    async def run():
        calls = Calls(engine, max_inflight=2)
        span = CallSpan("Generate", {}, lambda code: {})
        try:
            return await calls.run(GenerationRequest(prompt="x"), "Generate", span, timeout_s, on_delta)
        except CallFailed as failed:
            return failed

    return deltas, asyncio.run(run())


def test_a_deadline_passing_while_the_sessions_end_fails_nothing():
    engine = _Engine(before_final_s=0.0, cleanup_s=0.2)
    deltas, call = _call(engine, timeout_s=0.05)
    assert not isinstance(call, CallFailed), call  # the client had every token before the deadline
    assert call.code == grpc.StatusCode.OK and call.finish_reason == "length"
    assert [d.token_ids for d in deltas] == [[5], [6]]
    assert engine.cleaned and not engine.cut  # the cleanup ran out, not cut by the deadline


@pytest.mark.parametrize("cleanup_s", [0.0, 0.05])
def test_a_deadline_passing_before_the_last_token_fails_the_call_and_ends_the_sessions(cleanup_s):
    engine = _Engine(before_final_s=1.0, cleanup_s=cleanup_s)
    deltas, failed = _call(engine, timeout_s=0.05)
    assert isinstance(failed, CallFailed) and failed.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert [d.token_ids for d in deltas] == [[5]]
    assert engine.cleaned and not engine.cut  # its `finally` ran out: cancelled once, not again in it
