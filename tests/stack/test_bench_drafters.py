"""The drafter benchmark (`python -m specdec.bench.drafters`) end to end on tiny random models
through a real local stack, and its held-out sets kept apart from the tuning sets."""

from __future__ import annotations

import json

import pytest

from specdec.bench import drafters
from specdec.benchmark import heldout


def test_held_out_sets_share_no_prompt_with_the_tuning_sets():
    for kind, sets in heldout.sets().items():
        tuning = {text for _, text in sets["tuning"]}
        held = {text for _, text in sets["heldout"]}
        assert held and tuning and not tuning & held, kind
    assert len(heldout.sets()["repeated"]["heldout"]) >= 8 and len(heldout.sets()["repeated"]["tuning"]) >= 8


def test_the_drafter_benchmark_runs_every_arm_on_both_sets(tiny_dir, ray_local, tmp_path):
    out = tmp_path / "drafters.json"
    argv = [
        "--target-model", tiny_dir("llama", 1), "--arm", "suffix", "--arm", "suffix+tree@2",
        "--arm", f"suffix:{tiny_dir('llama', 2)}",
        "--kind", "repeated", "--passes", "1", "--prompts", "3", "--max-new-tokens", "8",
        "--max-prompt-tokens", "48", "--json", str(out),
    ]  # fmt: skip
    code = drafters.main(argv)
    results = json.loads(out.read_text())
    assert code == 0 and results["greedy_equal"]
    assert set(results["sets"]) == {"repeated/tuning", "repeated/heldout"}
    arms = ["ngram", "suffix", "suffix+tree@2", f"suffix:{tiny_dir('llama', 2)}"]
    for row in results["sets"].values():
        assert len(row["requests"]) == 3
        assert row["acceptance"]["suffix+tree@2"] <= 1.0
        assert set(row["tokens_per_s"]) == {"target_only", *arms} and all(v > 0 for v in row["tokens_per_s"].values())
        assert row["over_ngram"]["ngram"] == 1.0 and set(row["speedup"]) == set(arms)


def test_an_arm_names_its_drafter_trees_and_k():
    arm = "suffix+tree@16"
    assert (drafters._drafter(arm), drafters._tree(arm), drafters._k(arm, 8)) == ("suffix", True, 16)
    arm = "hybrid:distilled"
    assert (drafters._drafter(arm), drafters._tree(arm), drafters._k(arm, 8)) == (arm, False, 8)
    for bad in ("suffix@0", "suffix@17", "suffix@x"):
        with pytest.raises(SystemExit):
            drafters.parse_args(["--arm", bad])


def test_auto_is_chosen_on_held_out_sets_within_the_floor_of_ngram():
    def row(over, speedup):
        return {"over_ngram": over, "speedup": speedup}

    sets = {
        "a/heldout": row({"ngram": 1.0, "s": 1.2, "h": 0.9}, {"ngram": 2.0, "s": 2.4, "h": 3.0}),
        "b/heldout": row({"ngram": 1.0, "s": 1.0, "h": 1.5}, {"ngram": 1.0, "s": 1.0, "h": 1.5}),
        "a/tuning": row({"ngram": 1.0, "s": 0.1, "h": 9.0}, {"ngram": 1.0, "s": 0.1, "h": 9.0}),  # never counted
    }
    auto = drafters.choose_auto(sets, ["ngram", "s", "h"])
    assert auto["chosen"] == "s"  # h is faster on average but 0.9x of ngram on set a
    assert auto["scores"]["h"]["worst_over_ngram"] == 0.9
    sets["a/heldout"]["over_ngram"]["s"] = 0.5
    assert drafters.choose_auto(sets, ["s", "h"])["chosen"] == "h"  # none within the floor: the best worst case
