"""The offline drafter replay (`python -m specdec.bench.drafter_rounds`): its walk and its oracle
on hand-made cases, and the tool end to end on tiny random models."""

from __future__ import annotations

import json

from specdec.bench import drafter_rounds


def test_the_walk_follows_the_tree_as_far_as_the_target_goes():
    #         0   1   2   3   4        root -> 5 -> {6 -> 7, 8}; root -> 9
    tokens = [5, 6, 7, 8, 9]
    parents = [-1, 0, 1, 0, -1]
    assert drafter_rounds.accepted(tokens, parents, [5, 6, 7, 1]) == 3
    assert drafter_rounds.accepted(tokens, parents, [5, 8, 7]) == 2
    assert drafter_rounds.accepted(tokens, parents, [9, 9]) == 1
    assert drafter_rounds.accepted(tokens, parents, [4]) == 0
    assert drafter_rounds.accepted([1, 2], [-1, 0], [1, 2]) == 2  # a chain wholly accepted


def test_the_oracle_takes_the_best_continuation_of_any_earlier_occurrence():
    context = [3, 10, 11, 3, 20, 3]  # "3" was followed by 10 11 and by 20
    assert drafter_rounds.oracle(context, [], [20, 5]) == 1
    assert drafter_rounds.oracle(context, [], [10, 11, 12]) == 2
    assert drafter_rounds.oracle(context, [[7, 3, 10, 11, 12, 13]], [10, 11, 12, 13]) == 4  # an earlier completion
    assert drafter_rounds.oracle(context, [], [99]) == 0
    assert drafter_rounds.oracle([1, 2, 3], [], [1]) == 0  # the last token itself is no occurrence


def test_the_longest_match_oracle_chooses_only_among_the_best_matched_occurrences():
    # "3" follows "2" once (then 10 11) and stands alone once (then 20); the context ends "2 3".
    context = [2, 3, 10, 11, 3, 20, 2, 3]
    assert drafter_rounds.oracle(context, [], [20, 5]) == 1
    assert drafter_rounds.oracle(context, [], [20, 5], longest=True) == 0  # "3 20" matched one token only
    assert drafter_rounds.oracle(context, [], [10, 11, 12], longest=True) == 2
    # An earlier completion matching three tokens outranks the context's two-token match.
    assert drafter_rounds.oracle(context, [[20, 2, 3, 30]], [10, 11], longest=True) == 0
    assert drafter_rounds.oracle(context, [[20, 2, 3, 30]], [30], longest=True) == 1


def test_the_replay_runs_every_arm_on_a_tiny_target(tiny_dir, tmp_path):
    out, outputs = tmp_path / "rounds.json", tmp_path / "outputs.json"
    argv = [
        "--target-model", tiny_dir("llama", 1), "--draft", tiny_dir("llama", 2), "--kind", "repeated",
        "--max-new-tokens", "12", "--outputs", str(outputs), "--json", str(out),
    ]  # fmt: skip
    assert drafter_rounds.main(argv) == 0
    results = json.loads(out.read_text())
    assert set(results["sets"]) == {"repeated/tuning", "repeated/heldout"}
    for row in results["sets"].values():
        assert row["ngram"]["over_ngram"] == 1.0
        for arm in drafter_rounds.ARMS:
            assert 1.0 <= row[arm]["tokens_per_round"] <= 13.0
        coverage = [row["draft_coverage"][f"draft@{m}"] for m in drafter_rounds.DRAFT_TOP]
        assert all(0.0 <= c <= 1.0 for c in coverage) and coverage == sorted(coverage)
    # The outputs file is reused: a second run reads it and gives the same rounds.
    saved = json.loads(outputs.read_text())
    assert all(len(request["output"]) == 12 for request in saved.values())
    assert drafter_rounds.main(argv) == 0
    assert json.loads(out.read_text())["sets"] == results["sets"]
