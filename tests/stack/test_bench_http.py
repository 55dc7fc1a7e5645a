"""`python -m specdec.bench.http_api` runs and reports both APIs side by side (its transport and
capacity parts: no model, a client process of its own)."""

from __future__ import annotations

import json

from specdec.bench.http_api import main


def test_http_bench_reports_both_apis(tmp_path, capsys):
    out = tmp_path / "http.json"
    argv = [
        "--skip-stack",
        "--repeats",
        "1",
        "--transport-requests",
        "3",
        "--concurrency",
        "2",
        "--max-new-tokens",
        "4",
    ]
    assert main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["part"], r["mode"]) for r in rows] == [
        ("transport", "unary"),
        ("transport", "stream"),
        ("capacity", "unary"),
    ]
    for row in rows[:2]:
        assert row["grpc_latency_ms"] > 0 and row["http_latency_ms"] > 0
        assert [w["tokens"] for w in row["http_waves"]] == [3 * 2 * 4]  # every request's every token, counted
        assert [w["tokens"] for w in row["grpc_waves"]] == [3 * 2 * 4]
    assert rows[2]["grpc_requests_per_s"] > 0 and rows[2]["http_requests_per_s"] > 0
    assert "capacity  unary  c=2" in capsys.readouterr().out
