"""Smoke test of the single-process benchmark on a tiny random model (seconds, no Gemma)."""

from __future__ import annotations

import json

from tiny import make_tiny_model

from specdec.bench.single_process import METHODS, main
from specdec.benchmark.prompts import WORKLOADS, workload


def test_workloads_are_deterministic_and_copy_prompts_quote_stdlib_code():
    for name in WORKLOADS:
        assert workload(name, 2) == workload(name, 2)
    label, prompt = workload("copy", 1)[0]
    assert "def " in prompt and prompt.endswith("```python\n"), label


def test_bench_runs_all_methods_and_greedy_outputs_match(tmp_path):
    model = make_tiny_model("llama", tmp_path / "m", seed=1)
    out = tmp_path / "out.json"
    # The tiny model has a 256-token context: keep the prompt tail short.
    argv = [
        "--target-model",
        str(model),
        "--max-new-tokens",
        "8",
        "--repeats",
        "1",
        "--prompts",
        "1",
        "--max-prompt-tokens",
        "64",
        "--json",
        str(out),
    ]
    assert main(argv) == 0

    results = json.loads(out.read_text())
    assert set(results["workloads"]) == set(WORKLOADS)
    assert len(results["prompts"]) == len(WORKLOADS)
    for row in results["prompts"]:
        assert row["prompt_tokens"] <= 64
        assert row["new_tokens"] == 8  # EOS is off: every method generates exactly max_new_tokens
        assert set(row["tokens_per_s"]) == set(METHODS) and all(v > 0 for v in row["tokens_per_s"].values())
        assert all(len(times) == 1 for times in row["seconds"].values())
        assert row["greedy_equal"] == {name: True for name in METHODS}
        assert row["rounds"] >= 1 and 0.0 <= row["acceptance_rate"] <= 1.0
        assert row["tokens_per_round"] >= 1.0
        for key in ("speedup_ours", "speedup_hf", "accepted_per_position", "cpu_seconds"):
            assert key in row
    overall = results["overall"]
    assert overall["greedy_equal"] == {name: True for name in METHODS}
    assert overall["ours_over_peer"] > 0


def test_the_gpu_check_runs_on_a_cpu_and_finds_the_engine_exact(tmp_path):
    """bench/gpu_check.sh's script, on the CPU with a tiny model and --compile inductor: exactness
    holds in fp32 on the compiled engine, and the latency and throughput tables are filled for
    the eager and the compiled verifier."""
    from specdec.bench import gpu_engine

    model = make_tiny_model("gemma3", tmp_path / "m", seed=1, sliding_window=8)
    out = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--model", str(model), "--context", "40", "--concurrency", "1,4", "--repeats", "2"]
    argv += ["--new-tokens", "12", "--kv-cache-bytes", str(1 << 24), "--compile", "inductor", "--json", str(out)]
    assert gpu_engine.main(argv) == 0
    result = json.loads(out.read_text())
    exact = result["exactness"]
    assert exact["speculative_equal"] and exact["batched_equal"] and exact["new_tokens"] == 12
    assert exact["hf_generate_agrees"] == 12  # transformers' own generate, another code path
    assert set(result["verify_ms_by_k"]) == {str(k) for k in range(9)}
    assert all(set(cell) == {"eager", "inductor"} for cell in result["verify_ms_by_k"].values())
    assert set(result["decode_by_concurrency"]) == {"1", "4"}
    cells = [cell for by_name in result["decode_by_concurrency"].values() for cell in by_name.values()]
    assert len(cells) == 4 and all(cell["tokens_per_s"] > 0 for cell in cells)


def test_the_family_pass_bench_times_both_decoders_for_each_family(tmp_path):
    """One layer, a small vocabulary: each family's fused decoder and transformers' modules are
    timed on the same rows, and the ratios are written."""
    from specdec.bench import family_passes

    out = tmp_path / "families.json"
    argv = ["--families", "gemma3,qwen2", "--rows", "1,3", "--context", "8", "--passes", "1"]
    assert family_passes.main([*argv, "--layers", "1", "--vocab", "512", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["family"], r["rows"]) for r in rows] == [("gemma3", 1), ("gemma3", 3), ("qwen2", 1), ("qwen2", 3)]
    assert all(r["fused_ms"] > 0 and r["transformers_ms"] > 0 and "fused_over_gemma3" in r for r in rows)
