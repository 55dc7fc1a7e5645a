"""Faults during concurrent streaming generations, on the local stack of tiny models.

Each test starts the same greedy and seeded streams, lets every one of them get going, breaks a
part of the stack (kill -9 or SIGTERM the draft server, kill the target actor, kill -9 the
coordinator), restarts it, and checks what DESIGN.md promises: every stream that survives ends
with exactly the tokens of the unfaulted run (its deltas concatenated: nothing lost, nothing
twice), the part serves again, and nothing is left behind on any tier.

The draft tier runs the n-gram drafter: its drafts are point masses, so a seeded stream's output
is the target's own whatever k each round used, and a round that falls back to k = 0 changes
nothing (README, "Seeded requests are reproducible").
"""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from stackkit import REQUESTS, TTL_S, CoordinatorProcess, Stack, Streams, assert_same_output, run_streams, until

from specdec.coordinator.engine import EngineConfig


@pytest.fixture(scope="module")
def stack(fault_tiers):
    s = Stack(fault_tiers, EngineConfig(draft_retry_s=0.25))
    yield s
    s.close()


@pytest.fixture
def expected(fault_expected):
    return fault_expected


def _in_flight(streams: Streams) -> list[int]:
    """Messages so far per stream, asserting that every stream is still going."""
    snapshot = streams.snapshot()
    assert not any(done for _, done in snapshot), "a stream ended before the fault: make them longer"
    return [messages for messages, _ in snapshot]


def _serves_again(stack: Stack, expected) -> None:
    stack.coordinator.draft_ready()
    again = run_streams(stack.coordinator.address, REQUESTS)
    assert_same_output(again, expected)
    assert all(o.final.speculation.draft_tokens > 0 and o.final.speculation.draft_failures == 0 for o in again)
    stack.assert_clean()


def test_draft_server_killed_and_restarted_mid_stream(stack, expected):
    streams = Streams(stack.coordinator.address, REQUESTS).start()
    streams.wait_messages(3)
    at_kill = _in_flight(streams)
    stack.tiers.draft.kill()  # kill -9: connections reset, sessions gone
    streams.wait_messages([n + 4 for n in at_kill])  # the streams go on, without drafts
    stack.tiers.restart_draft()
    outcomes = streams.join()
    assert_same_output(outcomes, expected)
    # Every stream lost proposals to the dead server: one pipelined before the kill may serve a round, the next cannot.
    assert all(
        o.final.speculation.draft_failures >= 1 and o.final.speculation.non_speculative_rounds >= 1 for o in outcomes
    )
    stack.assert_clean()
    _serves_again(stack, expected)
    print(
        f"\ndraft kill -9: {len(outcomes)} streams, {sum(len(o.tokens) for o in outcomes)} tokens as unfaulted; "
        f"draft failures {[o.final.speculation.draft_failures for o in outcomes]}"
    )


@pytest.mark.long  # kill -9 above takes the same path on the coordinator's side
def test_draft_server_stopped_gracefully_and_restarted_mid_stream(stack, expected):
    streams = Streams(stack.coordinator.address, REQUESTS).start()
    streams.wait_messages(3)
    at_term = _in_flight(streams)
    stack.tiers.draft.signal(signal.SIGTERM)  # drains: NOT_SERVING, new calls UNAVAILABLE, calls in flight finish
    assert stack.tiers.draft.process.wait(30) == 0
    streams.wait_messages([n + 4 for n in at_term])
    stack.tiers.restart_draft()
    outcomes = streams.join()
    assert_same_output(outcomes, expected)
    assert all(o.final.speculation.draft_failures >= 1 for o in outcomes)
    stack.assert_clean()
    _serves_again(stack, expected)


def test_target_actor_killed_and_restarted_by_ray_mid_stream(stack, expected):
    started_at = stack.tiers.actor_info()["started_at"]
    resends = stack.coordinator.pool.resends
    streams = Streams(stack.coordinator.address, REQUESTS).start()
    streams.wait_messages(3)
    at_kill = _in_flight(streams)
    stack.tiers.kill_actor()
    outcomes = streams.join()
    assert_same_output(outcomes, expected)
    assert all(o.messages > n for o, n in zip(outcomes, at_kill))
    assert stack.tiers.actor_info()["started_at"] > started_at  # a new actor process served the rest
    assert stack.coordinator.pool.resends - resends >= len(REQUESTS)  # every session was re-prefilled
    stack.assert_clean()
    _serves_again(stack, expected)
    print(
        f"\nactor kill: {len(outcomes)} streams, {sum(len(o.tokens) for o in outcomes)} tokens as unfaulted; "
        f"{stack.coordinator.pool.resends - resends} resends; longest gap {max(max(o.gaps()) for o in outcomes):.1f} s"
    )


@pytest.mark.long  # two coordinator processes start (Ray, torch, tokenizer): about 35 s
def test_coordinator_killed_mid_stream_then_restarted(stack, expected):
    """kill -9 the coordinator process: its clients get UNAVAILABLE at once, what they got so far
    was right, both tiers free its sessions by their TTL, and a new coordinator serves the same."""
    coordinator = CoordinatorProcess(stack.tiers.draft.address, stack.tiers.pool_name)
    try:
        streams = Streams(coordinator.address, REQUESTS).start()
        streams.wait_messages(3)
        _in_flight(streams)
        killed = time.monotonic()
        coordinator.kill()
        outcomes = streams.join(30)
        for o, e in zip(outcomes, expected):
            assert o.code == grpc.StatusCode.UNAVAILABLE, (o.code, o.details)
            assert o.ended - killed < 5.0  # nothing hangs
            assert o.final is None and o.tokens == e.tokens[: len(o.tokens)]  # what arrived was right
        # The dead coordinator never ended its sessions: both tiers hold them until the TTL.
        held = stack.held()
        assert held["actor_sessions"] == held["draft_server_sessions"] == len(REQUESTS), held
        freed = until(
            lambda: stack.held()["actor_sessions"] == stack.held()["draft_server_sessions"] == 0,
            TTL_S + 10,
            "sessions freed by TTL",
        )
        assert freed < TTL_S + 5
        worst = max(o.ended - killed for o in outcomes)
        print(
            f"\ncoordinator kill -9: {len(outcomes)} streams UNAVAILABLE within {worst * 1e3:.0f} ms; "
            f"both tiers freed {len(REQUESTS)} sessions {freed:.1f} s later (TTL {TTL_S} s)"
        )
    finally:
        coordinator.stop()
    restarted = CoordinatorProcess(stack.tiers.draft.address, stack.tiers.pool_name)
    try:
        assert_same_output(run_streams(restarted.address, REQUESTS), expected)
    finally:
        restarted.stop()
    stack.assert_clean()


def _sigstop_draft_briefly(tiers) -> None:
    tiers.draft.signal(signal.SIGSTOP)
    time.sleep(1.0)  # the fault: a second of silence
    tiers.draft.signal(signal.SIGCONT)


def _sigterm_draft(tiers) -> None:
    tiers.draft.signal(signal.SIGTERM)
    assert tiers.draft.process.wait(30) == 0


# (what breaks, how, whether the draft server must be started again)
WAVES = [
    ("kill -9 the draft server", lambda t: t.draft.kill(), True),
    ("kill the target actor", lambda t: t.kill_actor(), False),
    ("kill -9 the draft server and kill the target actor", lambda t: (t.draft.kill(), t.kill_actor()), True),
    ("SIGTERM the draft server", _sigterm_draft, True),
    ("SIGSTOP the draft server for a second", _sigstop_draft_briefly, False),
    ("SIGTERM the draft server and kill the target actor", lambda t: (t.kill_actor(), _sigterm_draft(t)), True),
]


@pytest.mark.long
def test_waves_of_faults_one_after_another_and_together(stack, expected):
    """Every fault in turn, two at once in some waves: each wave's streams end with the unfaulted
    tokens, and the stack is clean and serving between waves."""
    survived = 0
    for what, fault, restart in WAVES:
        streams = Streams(stack.coordinator.address, REQUESTS).start()
        streams.wait_messages(3)
        at_fault = _in_flight(streams)
        fault(stack.tiers)
        if restart:
            streams.wait_messages([n + 4 for n in at_fault])
            stack.tiers.restart_draft()
        outcomes = streams.join()
        assert_same_output(outcomes, expected, what)
        stack.assert_clean(TTL_S + 10)
        survived += len(outcomes)
    _serves_again(stack, expected)
    print(f"\n{len(WAVES)} fault waves, {survived} streams survived with the unfaulted tokens")
