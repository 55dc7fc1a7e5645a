"""`specdec bench --peer vllm` against a real OpenAI-compatible server: a second `specdec up` on the
same tiny model stands in for vLLM (the CI machines have no vLLM), reached with --peer-url, so
the whole path runs for real: both servers' processes, the streamed waves with vLLM's
`ignore_eos` and `return_token_ids`, the token-for-token comparison, the table and the JSON."""

from __future__ import annotations

import asyncio
import json

from specdec.bench.suite import servers
from specdec.cli.app import main as cli_main


def test_the_server_comparison_runs_every_arm_and_compares_tokens(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    model, out, log = tiny_dir("llama", 1), tmp_path / "out", tmp_path / "peer.log"
    peer = servers.start_specdec(model, "32MiB", log)
    try:
        asyncio.run(servers.wait_ready(peer, "the stand-in peer", log))
        argv = [
            "bench", "--peer-url", peer.url, "--target-model", model,
            "--peer-sets", "free,similar_heldout", "--peer-prompts", "2", "--peer-kv-gib", "1",
            "--concurrency", "1,2", "--repeats", "1", "--max-new-tokens", "6", "--max-prompt-tokens", "32",
            "--out", str(out),
        ]  # fmt: skip
        code = cli_main(argv)
    finally:
        servers.stop(peer)
    assert peer.process.poll() is not None  # stopped, with every part it started

    result = json.loads((out / "peer_vllm.json").read_text())
    assert code == (0 if not result["mismatches"] else 1)
    # One stream at a time, every arm computes the same rows alike: outputs must be equal there.
    # (Two streams batch a tiny random model's near-flat logits, where fp32 rounding may tie.)
    assert [m for m in result["mismatches"] if m["level"] == 1] == []
    table = result["table"]
    assert set(table) == {"free", "similar_heldout"}
    for by_level in table.values():
        assert set(by_level) == {"1", "2"}
        assert set(by_level["1"]) == {"specdec_off", "specdec", "vllm", "transformers"}
        assert set(by_level["2"]) == {"specdec_off", "specdec", "vllm"}  # transformers serves one stream
        for level, by_arm in by_level.items():
            for arm, cell in by_arm.items():
                assert cell["tokens_per_s"] > 0 and cell["ttft_p99_ms"] >= cell["ttft_p50_ms"] > 0, (level, arm)
                # One repeat: each paired ratio is that repeat's own ratio of the two arms.
                for base in {"vllm", "specdec_off"} - {arm}:
                    mine, theirs = cell["tokens_per_s_repeats"], by_arm[base]["tokens_per_s_repeats"]
                    assert cell["x"][base] == mine[0] / theirs[0], (level, arm, base)
                    assert cell["x_first"][base] == mine[0] / theirs[0], (level, arm, base)
                if arm != "transformers":  # a streamed arm has chunks to time between
                    assert cell["itl_p99_ms"] >= cell["itl_p50_ms"] > 0, (level, arm)
                    assert cell["tpot_p99_ms"] >= cell["tpot_p50_ms"] > 0, (level, arm)
    assert result["config"]["commit"] and result["config"]["levels"] == [1, 2]
    printed = capsys.readouterr().out
    assert "== free: tokens/s (median), x vllm (median of paired repeats) ==" in printed
    assert "x off, paired" in printed and "specdec, 1st" in printed and "outputs equal:" in printed
