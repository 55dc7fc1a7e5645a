"""`specdec plan` (specdec/plan/capacity.py): the cost fit, the ITL-bound batch and the replica count on a
synthetic cost table whose answer is worked by hand, the errors, and the command itself."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys

import pytest

from specdec.plan.capacity import (
    PlanConfig,
    PlanError,
    closed_loop_tokens_per_s,
    erlang_c_wait_ms,
    fit_linear,
    load_costs,
    plan,
    tokens_per_round,
)

# A pass costs 10 ms + 1 ms a position; prompts are free; no overhead. At k = 0 a round is one
# token, so ITL(b) = 10 + b ms and a request of 101 tokens takes T(b) = R/2 + 100·R = 100.5·(10 + b) ms.
LINEAR = {
    "pass_ms": [{"rows": r, "tokens_per_row": t, "ms": 10 + r * t} for r in (1, 4, 16) for t in (1, 5)],
    "prefill_ms": [{"tokens": 32, "ms": 0.0}, {"tokens": 256, "ms": 0.0}],
    "round_overhead_ms": 0.0,
    "draft_tokens": 0,
    "max_batch": 64,
    "acceptance": {"free": 0.5, "copy": 0.9},
}
LOAD = {"rate": 20.0, "prompt_tokens": 64, "output_tokens": 101, "ttft_ms": 1e6, "itl_ms": 20.0}


@pytest.fixture
def costs_file(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(LINEAR))
    return path


def test_fit_recovers_a_linear_pass_cost_and_drops_what_the_data_cannot_carry():
    points = [(r, r * t, 3 + 0.5 * r + 2 * r * t) for r in (1, 2, 8) for t in (1, 3)]
    cost = fit_linear(points)
    assert (cost.fixed_ms, cost.per_row_ms, cost.per_position_ms) == pytest.approx((3, 0.5, 2))
    assert cost.rms_error_ms == pytest.approx(0, abs=1e-9)
    # One token a row: rows and positions are one column; the positions keep it (verify rows cost more).
    rows_only = fit_linear([(r, r, 4 + 3 * r) for r in (1, 2, 4)])
    assert (rows_only.fixed_ms, rows_only.per_row_ms, rows_only.per_position_ms) == pytest.approx((4, 0, 3))
    # A fit that would go negative loses that term: a flat cost is a constant.
    flat = fit_linear([(1, 1, 10.0), (4, 4, 9.0), (16, 16, 10.5)])
    assert flat.per_position_ms >= 0 and flat.per_row_ms >= 0


def test_tokens_per_round_is_leviathans_expectation():
    assert tokens_per_round(0.5, 3) == pytest.approx((1 - 0.5**4) / 0.5)
    assert tokens_per_round(1.0, 4) == 5
    assert tokens_per_round(0.8, 0) == 1


def test_replicas_on_a_linear_cost_table(costs_file):
    result = plan(PlanConfig(costs=str(costs_file), **LOAD), load_costs(str(costs_file)))
    assert result.batch_limit == 10  # ITL(10) = 20 ms, the limit
    capacity = 10 / (100.5 * 20 / 1000)  # requests/s of one replica at B = 10
    assert result.target_replicas == math.ceil(20 / capacity) == 5
    # At 4 requests/s a replica: b = 4 · 0.1005 · (10 + b)  ->  b = 4.02 / 0.598.
    assert result.operating.batch == pytest.approx(4.02 / 0.598, rel=1e-6)
    assert result.operating.itl_ms == pytest.approx(10 + 4.02 / 0.598, rel=1e-6)
    assert result.tokens_per_s == 20 * 101 and result.draft_replicas == 0


def test_the_itl_limit_binds_the_batch(costs_file):
    costs = load_costs(str(costs_file))
    tight = plan(PlanConfig(costs=str(costs_file), **{**LOAD, "itl_ms": 15.0}), costs)
    assert tight.batch_limit == 5 and tight.operating.itl_ms <= 15
    assert tight.target_replicas > plan(PlanConfig(costs=str(costs_file), **LOAD), costs).target_replicas
    with pytest.raises(PlanError, match="--itl-ms: 10 ms cannot be met: 11.0 ms at one stream"):
        plan(PlanConfig(costs=str(costs_file), **{**LOAD, "itl_ms": 10.0}), costs)


def test_speculation_multiplies_what_a_round_commits(costs_file):
    costs = load_costs(str(costs_file))
    k4 = plan(PlanConfig(costs=str(costs_file), **LOAD, draft_tokens=4, workload="copy"), costs)
    assert k4.alpha == 0.9 and k4.tokens_per_round == pytest.approx(tokens_per_round(0.9, 4))
    # A 5-position row: ITL(b) = (10 + 5b) / E(0.9, 4) <= 20  ->  b <= (20·4.0951 − 10) / 5.
    assert k4.batch_limit == math.floor((20 * tokens_per_round(0.9, 4) - 10) / 5)
    assert k4.target_replicas < 5 and k4.draft_replicas == 1  # free drafts: one draft replica serves all
    one = closed_loop_tokens_per_s(costs, 1, 64, 101, 0.0, 0)
    assert one == pytest.approx(1000 * 101 / (100.5 * 11))


def test_erlang_c_wait():
    assert erlang_c_wait_ms(1, 0.5, 100) == pytest.approx(100)  # M/M/1: ρ/(1−ρ)·S
    assert erlang_c_wait_ms(4, 4.0, 100) == math.inf


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"rate": -1.0}, "--rate"),
        ({"prompt_tokens": 0}, "--prompt-tokens"),
        ({"alpha": 1.5, "draft_tokens": 2}, "--alpha"),
        ({"workload": "chat", "draft_tokens": 2}, "--workload"),
        ({"draft_tokens": -1}, "--draft-tokens"),
        ({"ttft_ms": 0.001}, "--ttft-ms"),
    ],
)
def test_bad_input_names_its_flag(costs_file, change, flag):
    with pytest.raises(PlanError) as caught:
        plan(PlanConfig(costs=str(costs_file), **{**LOAD, **change}), load_costs(str(costs_file)))
    assert caught.value.flag == flag


def test_a_bad_costs_file_names_the_flag(tmp_path):
    with pytest.raises(PlanError, match="--costs: no such file"):
        load_costs(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"pass_ms": [{"rows": 1}]}')
    with pytest.raises(PlanError, match="--costs: .* is not a costs file"):
        load_costs(str(tmp_path / "bad.json"))


def _specdec(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdec.cli.app", "plan", *argv], capture_output=True, text=True, timeout=120
    )


def test_specdec_plan_prints_the_plan_and_refuses_bad_input(costs_file, tmp_path):
    flags = ["--costs", str(costs_file), "--rate", "20", "--prompt-tokens", "64", "--output-tokens", "101"]
    out = tmp_path / "plan.json"
    done = _specdec(*flags, "--ttft-ms", "1000000", "--itl-ms", "20", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "target replicas: 5" in done.stdout and "draft replicas:  0" in done.stdout
    assert json.loads(out.read_text())["plan"]["target_replicas"] == 5
    for argv, flag in (
        (["--costs", str(tmp_path / "none.json")], "--costs"),
        ([*flags, "--rate", "-2"], "--rate"),
        ([*flags, "--itl-ms", "5"], "--itl-ms"),
        ([*flags, "--ttft-ms", "0.01"], "--ttft-ms"),
    ):
        done = _specdec(*argv)
        assert done.returncode == 2 and flag in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)


def test_the_plan_flags_keep_their_contract(monkeypatch):
    from unit.test_config_flags import CONTRACT, _described

    from specdec.cli import app

    p = argparse.ArgumentParser(prog="specdec")
    parser = app._plan_parser(p.add_subparsers())
    flags = {a.option_strings[0]: _described(a) for a in parser._actions if a.option_strings[:1] != ["-h"]}
    assert flags == CONTRACT["plan"]


def test_a_per_stream_overhead_is_recovered_from_two_calibration_levels(tmp_path):
    """The calibration: the overhead each level's tokens/s implies, then a line through them,
    gives back the per-round and per-stream overheads the measurement came from."""
    from specdec.plan.calibrate import overhead_for, overhead_line

    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(LINEAR | {"round_overhead_ms": 30.0, "round_overhead_per_row_ms": 2.5}))
    costs = load_costs(str(truth))
    measured = {n: closed_loop_tokens_per_s(costs, n, 64, 33, 0.0, 0) for n in (2, 8)}
    implied = {n: overhead_for(costs, n, tps, 64, 33) for n, tps in measured.items()}
    assert implied[2] == pytest.approx(30 + 2.5 * 2, rel=1e-6)
    assert implied[8] == pytest.approx(30 + 2.5 * 8, rel=1e-6)
    fixed, per_row, _ = overhead_line(costs, measured, 64, 33)
    assert (fixed, per_row) == (pytest.approx(30.0, rel=1e-6), pytest.approx(2.5, rel=1e-6))
    # The per-stream term matters: without it, 16 streams would be predicted faster.
    flat = dataclasses.replace(costs, round_overhead_per_row_ms=0.0)
    assert closed_loop_tokens_per_s(flat, 16, 64, 33, 0.0, 0) > 1.1 * closed_loop_tokens_per_s(
        costs, 16, 64, 33, 0.0, 0
    )
