"""Smoke test of the target-tier benchmark: --quick, in-process only (no Ray), tiny model."""

from __future__ import annotations

import json

from specdec.bench.verify_pool import main


def test_quick_bench_reports_every_case_and_batched_equals_one_at_a_time(tmp_path):
    out = tmp_path / "out.json"
    assert main(["--quick", "--no-ray", "--json", str(out)]) == 0

    results = json.loads(out.read_text())
    assert {"date", "machine", "argv", "k", "context", "repeats"} <= set(results)
    (model,) = results["models"]  # --quick: the tiny model only
    assert [row["k"] for row in model["latency"]] == [0, 1, 2, 4, 8, 12, 16]
    for row in model["latency"]:
        assert row["in_process_ms"] > 0 and row["positions_per_s"] > 0
        assert "pool_ms" not in row  # no Ray
    assert [row["sessions"] for row in model["throughput"]] == [1, 4, 8, 16]
    for row in model["throughput"]:
        assert row["batched_tok_s"] > 0 and row["one_at_a_time_tok_s"] > 0
        assert row["ratio"] == row["batched_tok_s"] / row["one_at_a_time_tok_s"]
        assert "pool_ratio" not in row

    # Same rounds, same accepted tokens, whether the 16 sessions share one forward or not; the
    # drafts were built to accept 0..k tokens, so the comparison covers every acceptance count.
    assert model["identical"]
    assert model["accepted_batched"] == model["accepted_one_at_a_time"]
    assert len(model["accepted_batched"]) == 16
    assert set(model["num_accepted"]) == set(range(results["k"] + 1))
