"""The target tier's scheduler: a pass's plan under a small token budget (whole rounds first,
prefill chunks in what is left, the budget kept), pinning and preemption, and admission."""

from __future__ import annotations

import torch

from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.runtime.kv_pool import KVShape
from specdec.target_service.protocol import VerifyRequest
from specdec.target_service.scheduler import ItemRejected, VerifyItem
from specdec.target_service.verifier import TargetVerifier

GREEDY = SamplingParams()
MiB = 1 << 20


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _held(verifier: TargetVerifier, session_id: str, prompt: list[int]) -> list[int]:
    """Run a first round of `prompt` without drafts; the session's next context."""
    result = verifier.verify(session_id, prompt, DraftProposal([]), GREEDY)
    return prompt + result.accepted_ids


def _mixed(verifier: TargetVerifier) -> list[VerifyItem]:
    """A decode row, a verify row of 3 drafts, a long new prompt, a bad round, and a second round
    of the decode row's session."""
    decode = _held(verifier, "decode", _ids(1, 6))
    verify = _held(verifier, "verify", _ids(2, 9))
    return [
        VerifyItem("long", _ids(3, 40), DraftProposal([5]), GREEDY),
        VerifyItem("decode", decode, DraftProposal([]), GREEDY),
        VerifyItem("bad", [1, 2, 10_000], DraftProposal([3]), GREEDY),
        VerifyItem("verify", verify, DraftProposal([7, 8, 9]), GREEDY),
        VerifyItem("decode", decode + [4], DraftProposal([]), GREEDY),
    ]


def test_a_plan_puts_whole_rounds_first_and_chunks_a_prefill_in_the_budget_left(tiny):
    verifier = TargetVerifier(tiny("llama", 1), kv_cache_bytes=16 * MiB, pass_tokens=16)
    items = _mixed(verifier)
    scheduler = verifier.scheduler
    with scheduler.schedule(items) as plan:
        assert scheduler.sessions.pinned == {"long", "decode", "bad", "verify"}
        ids = [r.item.session_id for r in plan.rows]
        assert ids == ["decode", "verify", "long"]  # whole rounds first, in queue order, then the chunk
        decode, verify, long = plan.rows
        assert (len(decode.row.tokens), decode.row.keep, decode.decides) == (1, 1, True)
        assert (len(verify.row.tokens), verify.row.keep, verify.decides) == (4, 4, True)  # the last token and 3 drafts
        assert (len(long.row.tokens), long.row.keep, long.decides) == (16 - 5, 0, False)  # what the budget left
        assert plan.tokens == 16 == scheduler.pass_tokens
        assert plan.batch == [r.row for r in plan.rows] and plan.deciding == [decode, verify]
        assert list(plan.rejected) == [items[2]] and isinstance(plan.rejected[items[2]], ItemRejected)
        assert "outside [0, 259)" in str(plan.rejected[items[2]])
        # The rows' blocks are taken: each table reaches past the tokens its row feeds.
        assert verify.item is items[3] and verify.session.table.length == len(items[3].tokens) + 3
        assert scheduler.sessions["long"].table.length == 11
    assert scheduler.sessions.pinned == set()

    # The verifier runs exactly that plan: two rounds decided, the prefill and the second round
    # of "decode" wait for a later pass, the bad round fails alone.
    fresh = TargetVerifier(tiny("llama", 1), kv_cache_bytes=16 * MiB, pass_tokens=16)
    items = _mixed(fresh)
    results = fresh.step(items)
    kinds = [type(results.get(item)).__name__ for item in items]
    assert kinds == ["NoneType", "Verification", "ItemRejected", "Verification", "NoneType"]
    assert len(results) == 3  # the rounds waiting for a later pass have no entry
    assert fresh.sessions["long"].table.length == 11


def test_preemption_takes_sessions_outside_the_pass_and_never_a_pinned_one(tiny):
    """A pool of 5 blocks of 16: "old" holds 3 and "idle" 1. A pass of "old"'s next round and two
    new prompts of 2 blocks each: the first takes "idle"'s block, the second waits."""
    target = tiny("llama", 1)
    per_token = KVShape.of(target.model.config).bytes_per_token(torch.float32)
    verifier = TargetVerifier(target, kv_cache_bytes=per_token * 16 * 6)
    assert verifier.pool.num_blocks == 5
    old = _held(verifier, "old", _ids(1, 40))
    _held(verifier, "idle", _ids(2, 10))
    assert verifier.pool.free_blocks == 1
    items = [
        VerifyItem("old", old, DraftProposal([]), GREEDY),
        VerifyItem("a", _ids(3, 20), DraftProposal([]), GREEDY),
        VerifyItem("b", _ids(4, 20), DraftProposal([]), GREEDY),
    ]
    with verifier.scheduler.schedule(items) as plan:
        assert [r.item.session_id for r in plan.rows] == ["old", "a"]
        assert not plan.rejected  # "b" waits: no session outside the pass is left to preempt
        assert verifier.pool.free_blocks == 0
    assert "idle" not in verifier.sessions and "old" in verifier.sessions
    assert verifier.sessions.evicted.pressure == 1


def test_admission_resolves_the_held_prefix_or_answers_a_miss(tiny):
    verifier = TargetVerifier(tiny("llama", 1), kv_cache_bytes=16 * MiB)
    scheduler = verifier.scheduler
    prompt = _ids(1, 8)
    first = scheduler.admit(VerifyRequest("s", 0, prompt, [9, 10], None, GREEDY))
    assert vars(first) == vars(VerifyItem("s", prompt, DraftProposal([9, 10]), GREEDY))
    assert scheduler.admit(VerifyRequest("s", 3, [1], [], None, GREEDY)) is None  # the session is not held
    context = _held(verifier, "s", prompt)
    item = scheduler.admit(VerifyRequest("s", 5, [42], [], None, GREEDY))
    assert item.tokens == context[:5] + [42]
    assert scheduler.admit(VerifyRequest("s", 9, [], [], None, GREEDY)) is None  # more than it holds
    too_long = scheduler.admit(VerifyRequest("t", 0, [1] * scheduler.max_context, [2], None, GREEDY))
    assert isinstance(too_long, ItemRejected) and "the model's context" in str(too_long)
