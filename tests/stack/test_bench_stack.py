"""Smoke test of the full-stack benchmark on a tiny random model: real draft server, real local
Ray target actor, real gRPC coordinators (seconds, no Gemma)."""

from __future__ import annotations

import json

from specdec.bench.stack import METHODS, main


def test_stack_bench_runs_every_method_and_greedy_outputs_match(tiny_dir, ray_local, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out.json"
    argv = [
        "--target-model", tiny_dir("llama", 1), "--drafter", "ngram", "--drafter", "first:1",
        "--workload", "copy", "--max-new-tokens", "8", "--repeats", "1", "--prompts", "1",
        "--max-prompt-tokens", "64", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0

    results = json.loads(out.read_text())
    assert [row["drafter"] for row in results["prompts"]] == ["ngram", "first:1"]
    for row in results["prompts"]:
        assert row["new_tokens"] == 8  # EOS off: every method generates exactly max_new_tokens
        assert row["greedy_equal"] == {name: True for name in METHODS}
        assert all(row["tokens_per_s"][m] > 0 for m in METHODS)
        for method, split in row["time_split"].items():
            assert 0.0 < split["verify"] <= 1.0, method  # every method waited on the target
            assert sum(split.values()) <= 1.0 + 1e-6, method
        # k = 0 methods never wait on a drafter; the stack's calls all cross gRPC.
        assert row["time_split"]["single_k0"]["draft"] < 0.05
        assert row["time_split"]["stack_spec"]["outside"] > 0.0
        assert row["rounds"] >= 1 and row["tokens_per_round"] >= 1.0
    assert set(results["overall"]) == {"ngram", "first:1"}


def test_tracing_bench_compares_traced_and_untraced_requests(tiny_dir, ray_local, tmp_path):
    from specdec.bench.tracing import main as tracing_main

    out = tmp_path / "tracing.json"
    argv = [
        "--target-model",
        tiny_dir("llama", 1),
        "--workload",
        "copy",
        "--prompts",
        "1",
        "--repeats",
        "1",
        "--max-new-tokens",
        "8",
        "--max-prompt-tokens",
        "64",
        "--json",
        str(out),
    ]
    assert tracing_main(argv, install_global=False) == 0
    results = json.loads(out.read_text())
    row = results["prompts"][0]
    assert row["tokens_per_s"]["traced"] > 0 and row["tokens_per_s"]["untraced"] > 0
    # Tracing on really traced every tier; the spans came from the traced requests only.
    assert {"specdec-coordinator", "specdec-draft", "specdec-target"} <= set(results["spans_by_service"])
