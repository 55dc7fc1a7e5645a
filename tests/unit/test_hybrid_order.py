"""bench/hybrid_order.py: the offline walk that chose the hybrid's order prices rounds right."""

from __future__ import annotations

import pytest

from specdec.bench.hybrid_order import ORDERS, Case, walk

PROMPT = [1, 2, 3]
CONTINUATION = [4, 5, 6, 7]
SEQUENCE = PROMPT + CONTINUATION


def _case(right: bool, confidence: float = 1.0) -> Case:
    argmax = SEQUENCE[1:] + [0] if right else [9] * len(SEQUENCE)  # at i: the token for i + 1
    return Case(PROMPT, CONTINUATION, argmax, [confidence] * len(SEQUENCE))


def test_a_draft_that_is_always_right_doubles_tokens_per_step_at_no_cost():
    # Round 1 drafts 4 5 (both right, then the target's 6); round 2 has room for no draft (7 is the target's).
    free = walk([_case(True)], ("model",), k=2, model_k=2, min_confidence=0.0, verify_cost=0.0, draft_cost=0.0)
    assert free.speedup == pytest.approx(4 / 2) and free.first_token == {"model": (1, 1)}
    priced = walk([_case(True)], ("model",), k=2, model_k=2, min_confidence=0.0, verify_cost=0.5, draft_cost=0.1)
    assert priced.speedup == pytest.approx(4 / (1 + 0.5 * 2 + 0.1 * 2 + 1))


def test_a_wrong_draft_costs_its_verify_and_an_unsure_one_only_its_step():
    wrong = walk([_case(False)], ("model",), k=2, model_k=2, min_confidence=0.0, verify_cost=0.5, draft_cost=0.1)
    # Three rounds whose first token is wrong (two of them with room for a second token, drafted
    # and verified but never judged), then the last token's round without a draft.
    assert wrong.first_token == {"model": (0, 3)}
    assert wrong.speedup == pytest.approx(4 / (2 * (1 + 0.5 * 2 + 0.1 * 2) + (1 + 0.5 + 0.1) + 1))
    unsure = walk(
        [_case(True, confidence=0.2)], ("model",), k=2, model_k=2, min_confidence=0.3, verify_cost=0.5, draft_cost=0.1
    )
    assert unsure.first_token == {} and unsure.speedup == pytest.approx(4 / (3 * 1.1 + 1))


def test_the_first_source_that_proposes_answers():
    # The context ends in 7 8, seen before and followed by 9 7: a 2-token match, shorter than
    # min_match; the draft is always wrong (token 0).
    repeat = Case([7, 8, 9, 7, 8], [9, 7, 8, 9], [0] * 9, [1.0] * 9)
    expected = {
        "long>short>model": "short",
        "long>short": "short",
        "ngram": "ngram",
        "long>model>short": "model",
        "model": "model",
    }
    for name, source in expected.items():
        first = walk(
            [repeat], ORDERS[name], k=2, model_k=1, min_confidence=0.0, verify_cost=0.0, draft_cost=0.0
        ).first_token
        if source == "model":  # it answers first, and wrongly
            assert first["model"][0] == 0 and first["model"][1] >= 1, name
        else:  # the match's 9 7 is right, 8 is the target's own, 9 the last token's round: no other round drafts
            assert first == {source: (1, 1)}, name
