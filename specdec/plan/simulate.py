"""`specdec plan` at GPU scale: a plan for 50-1,000 requests/s on H100 costs, checked by simulation.

  python -m specdec.plan.simulate [--seconds 120] [--seed 0] [--json PATH] [--png PATH]

Costs are a model from public figures, not a measurement (docs/planning.md states each): an
8B target (Llama 3.1 8B, bf16) and a 1B draft (Llama 3.2 1B) on one H100 SXM each. For every
load the planner (specdec/plan/capacity.py) sizes both tiers with speculation (k = 4) and without; then a
seeded discrete-event simulation of one target replica at its share of the load (a Poisson split
is Poisson) replays it pass by pass: continuous batching up to the planner's batch, each admitted
prompt prefilled inside the next pass, each running sequence committing 1 + (accepted drafts)
tokens a round with every draft accepted with probability α until the first rejection. It reports
TTFT and the per-request inter-token latency (time after the first token over the tokens after
it), p50 and p99, next to the planner's expected values and the limits.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import deque
from pathlib import Path

from specdec.plan.capacity import Model, PlanConfig, load_costs, model_for, plan

# Public figures. H100 SXM: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16 (NVIDIA's datasheet); assumed
# reachable: 70% of the bandwidth, 50% of the FLOPs. Llama 3.1 8B: 8.03e9 parameters, 32 layers,
# 8 KV heads of 128 (131,072 KV bytes a token in bf16); Llama 3.2 1B: 1.24e9 parameters, 16 layers,
# 8 KV heads of 64 (32,768 bytes a token). Mean context 512 + 128 tokens.
BANDWIDTH, FLOPS, CONTEXT = 0.7 * 3.35e12, 0.5 * 989e12, 640


def _ms(x: float) -> float:
    return 1000 * x


TARGET_WEIGHTS_MS = _ms(2 * 8.03e9 / BANDWIDTH) + 0.3  # every pass reads the weights once; + launches
TARGET_POSITION_MS = _ms(2 * 8.03e9 / FLOPS)  # 2 FLOPs a parameter a position
TARGET_ROW_MS = _ms(CONTEXT * 131_072 / BANDWIDTH)  # a row reads its KV
DRAFT_STEP_MS = _ms(2 * 1.24e9 / BANDWIDTH) + 0.5
DRAFT_ROW_MS = _ms(CONTEXT * 32_768 / BANDWIDTH) + _ms(2 * 1.24e9 / FLOPS)
ALPHA = {"similar": 0.47, "free": 0.34, "copy": 0.94}  # suffix, held-out (bench/results/drafters_merged.json)
LOADS = (50, 100, 250, 500, 750, 1000)
LIMITS = {"prompt_tokens": 512, "output_tokens": 256, "ttft_ms": 500.0, "itl_ms": 20.0}


def h100_costs() -> dict:
    """A costs file in the planner's format from the figures above (the points lie on its model)."""
    return {
        "kind": "specdec plan costs",
        "source": "model from public H100, Llama 3.1 8B and Llama 3.2 1B figures (specdec/plan/simulate.py)",
        "pass_ms": [
            {"rows": r, "tokens_per_row": t, "ms": TARGET_WEIGHTS_MS + TARGET_ROW_MS * r + TARGET_POSITION_MS * r * t}
            for r in (1, 8, 64, 256)
            for t in (1, 5)
        ],
        "prefill_ms": [{"tokens": n, "ms": TARGET_WEIGHTS_MS + TARGET_POSITION_MS * n} for n in (128, 512, 2048)],
        "draft_step_ms": [{"rows": r, "ms": DRAFT_STEP_MS + DRAFT_ROW_MS * r} for r in (1, 64, 256)],
        "round_overhead_ms": 1.0,  # scheduling and the draft tier's RPC, assumed
        "draft_tokens": 4,
        "max_batch": 256,
        "acceptance": ALPHA,
    }


def simulate(model: Model, batch_limit: int, rate_per_s: float, seconds: float, seed: int) -> dict:
    """One replica, pass by pass; returns TTFT and per-request ITL percentiles (ms)."""
    rng = random.Random(seed)
    c, k = model.costs, model.k
    arrivals, t = deque(), 0.0
    while t < seconds * 1000:
        t += rng.expovariate(rate_per_s / 1000)
        arrivals.append(t)
    now, running, ttft, itl = 0.0, [], [], []  # running: [arrival, first-token time, tokens left]
    warm = seconds * 1000 * 0.1  # requests arriving in the first tenth are not counted
    while arrivals or running:
        if not running and arrivals and arrivals[0] > now:
            now = arrivals[0]
        admitted = []
        while arrivals and arrivals[0] <= now and len(running) + len(admitted) < batch_limit:
            admitted.append(arrivals.popleft())
        rows = len(running)
        # Admitted prompts ride in this pass: each adds its positions; the pass's fixed cost is
        # paid once, by the decode rows or, with none, by the prompts' own pass.
        pass_ms = c.overhead_ms(rows) + len(admitted) * c.prefill.per_position_ms * model.prompt_tokens
        if rows:
            pass_ms += c.target_pass.ms(rows, k + 1) + (k * c.draft_step.ms(min(rows, model.draft_batch)) if k else 0)
        elif admitted:
            pass_ms += c.prefill.fixed_ms
        now += pass_ms
        still = []
        for seq in running:
            accepted = 0
            while accepted < k and rng.random() < model.alpha:
                accepted += 1
            seq[2] -= min(seq[2], accepted + 1)
            if seq[2] == 0:
                if seq[0] >= warm:
                    itl.append((now - seq[1]) / (model.output_tokens - 1))
            else:
                still.append(seq)
        for arrival in admitted:
            if arrival >= warm:
                ttft.append(now - arrival)
            still.append([arrival, now, model.output_tokens - 1])
        running = still
    return {
        "requests": len(itl),
        "ttft_ms_mean": statistics.mean(ttft),
        "ttft_ms_p50": statistics.median(ttft),
        "ttft_ms_p99": _percentile(ttft, 0.99),
        "itl_ms_mean": statistics.mean(itl),
        "itl_ms_p50": statistics.median(itl),
        "itl_ms_p99": _percentile(itl, 0.99),
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.plan.simulate", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0, help="simulated seconds a load (default 120)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default="similar", choices=sorted(ALPHA))
    p.add_argument("--costs", default="bench/results/plan_costs_h100.json", help="where to write the H100 costs")
    p.add_argument("--json", default="bench/results/plan_gpu.json", metavar="PATH")
    p.add_argument("--png", default="bench/results/plan_gpu.png", metavar="PATH")
    args = p.parse_args(argv)
    Path(args.costs).write_text(json.dumps(h100_costs(), indent=1) + "\n")
    costs = load_costs(args.costs)
    rows = []
    for arm, k in (("speculation", 4), ("off", 0)):
        for load in LOADS:
            config = PlanConfig(costs=args.costs, rate=load, workload=args.workload, draft_tokens=k, **LIMITS)
            result = plan(config, costs)
            sim = simulate(
                model_for(config, costs),
                result.batch_limit,
                load / result.target_replicas,
                args.seconds,
                args.seed + load,
            )
            rows.append({"arm": arm, "rate": load, **result.as_dict(), "simulated": sim})
            print(
                f"{arm:<11} {load:>5} req/s: {result.target_replicas:>4} target + {result.draft_replicas:>3} draft "
                f"replicas, ITL {result.operating.itl_ms:5.1f} ms (sim p50 {sim['itl_ms_p50']:5.1f}, "
                f"p99 {sim['itl_ms_p99']:5.1f}), TTFT {result.ttft_ms:4.0f} ms (sim mean {sim['ttft_ms_mean']:4.0f}, "
                f"p99 {sim['ttft_ms_p99']:4.0f})"
            )
    out = {"config": {**vars(args), **LIMITS, "alpha": ALPHA[args.workload]}, "plans": rows}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    _figure(rows, args.png)
    return 0


def _figure(rows: list[dict], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for arm, style in (("speculation", "-o"), ("off", "--s")):
        mine = [r for r in rows if r["arm"] == arm]
        loads = [r["rate"] for r in mine]
        left.plot(loads, [r["target_replicas"] for r in mine], style, label=f"target GPUs, {arm}")
        if arm == "speculation":
            left.plot(loads, [r["draft_replicas"] for r in mine], ":^", label="draft GPUs, speculation")
        right.plot(loads, [r["itl_ms"] for r in mine], style, label=f"planner ITL, {arm}")
        right.plot(loads, [r["simulated"]["itl_ms_p99"] for r in mine], style, alpha=0.4, label=f"simulated p99, {arm}")
    right.axhline(LIMITS["itl_ms"], color="grey", lw=0.8, label="ITL limit")
    left.set(xlabel="requests/s", ylabel="replicas (one H100 each)", title="replicas for the load")
    right.set(xlabel="requests/s", ylabel="inter-token latency, ms", title="ITL at the planned replicas")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("8B target, 1B draft on H100 (cost model), 512 + 256 tokens, TTFT <= 500 ms, ITL <= 20 ms")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
