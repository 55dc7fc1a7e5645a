"""`specdec bench --peer vllm` against a real OpenAI-compatible server: a second `specdec up` on the
same tiny model stands in for vLLM (the CI machines have no vLLM), reached with --peer-url, so
the whole path runs for real: both servers' processes, the streamed waves with vLLM's
`ignore_eos` and `return_token_ids`, the token-for-token comparison, the table and the JSON."""

from __future__ import annotations

import asyncio
import json

from specdec.benchmark import servers
from specdec.cli.app import main as cli_main


def test_the_server_comparison_runs_every_arm_and_compares_tokens(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    model, out, log = tiny_dir("llama", 1), tmp_path / "out", tmp_path / "peer.log"
    peer = servers.start_specdec(model, "32MiB", log)
    try:
        asyncio.run(servers.wait_ready(peer, "the stand-in peer", log))
        argv = [
            "bench", "--peer-url", peer.url, "--target-model", model,
            "--peer-workload", "cold,repeat", "--cold-serial-prompts", "2", "--specdec-flags", "--itl-slo-ms 5000",
            "--peer-sets", "free,similar_heldout", "--peer-prompts", "2", "--peer-kv-gib", "1",
            "--concurrency", "1,2", "--repeats", "1", "--max-new-tokens", "6", "--max-prompt-tokens", "32",
            "--out", str(out),
        ]  # fmt: skip
        code = cli_main(argv)
    finally:
        servers.stop(peer)
    assert peer.process.poll() is not None  # stopped, with every part it started

    result = json.loads((out / "peer_vllm.json").read_text())
    # Every arm at every level, batched or not, gives the very same tokens for a prompt.
    assert result["mismatches"] == [] and code == 0
    table = result["table"]
    assert set(table) == {"cold", "free", "similar_heldout"} and result["repeat_sets"] == ["free", "similar_heldout"]
    # The cold workload: its levels took prompts of their own, each arm a server of its own.
    (by_level,) = result["cold"]["plan"]
    assert len(by_level["1"]) == 2 and len(by_level["2"]) == 2 and not set(by_level["1"]) & set(by_level["2"])
    assert (out / "cold-specdec.log").exists() and (out / "cold-specdec_off.log").exists()
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
                    for name in ("itl", "token_gap", "tpot"):
                        p50, p90, p99 = (cell[f"{name}_p{q}_ms"] for q in (50, 90, 99))
                        assert p99 >= p90 >= p50 > 0, (level, arm, name)
                    assert cell["tokens_per_chunk"] >= 1
    config = result["config"]
    assert config["commit"] and config["levels"] == [1, 2] and config["cpu"]["model"]
    assert config["specdec_flags"] == ["--itl-slo-ms", "5000"]
    printed = capsys.readouterr().out
    assert "== cold: each prompt once in a server's life: tokens/s (median)" in printed
    assert "== repeat, set free: tokens/s (median), x vllm (median of paired repeats) ==" in printed
    assert printed.index("== cold") < printed.index("== repeat")  # the headline first
    assert f"CPU: {config['cpu']['model']}" in printed and "ttft p50/p90/p99" in printed
    assert "x off, paired" in printed and "specdec, 1st" in printed and "outputs equal: yes" in printed
