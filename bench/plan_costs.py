"""The costs `specdec plan` reads, measured on the local engine, and the planner checked against the stack.

  python -m specdec.bench.plan_costs [--repeats 3] [--max-new-tokens 32] [--json PATH]

1. Costs, in this process on the verifier the actor runs (`TargetVerifier`, no transport): the
   median wall time of a target pass over R sessions of --context tokens with T positions a row
   (T = 1: decode; T = k + 1: verifying k drafts), and of prefilling one prompt of L tokens.
2. Check: the local stack (`specdec up`'s parts: the n-gram draft server, one target actor on a
   local Ray, a coordinator over gRPC on loopback), greedy, EOS off, speculation off, with N = 1, 4
   and 16 closed-loop streams (each sends --requests-per-stream requests back to back, over four
   short prompts: bench/engine_load.py's), --repeats times in a fresh seeded order, medians.
   Two more levels, 2 and 8 streams (never checked), calibrate the round's overhead outside
   the pass (gRPC, the coordinator's round loop, the actor's transport): at each level,
   the overhead that makes the planner's closed loop give the measured tokens/s; a line through
   the two is o + o_r·streams (o_r: each stream's share of the host, which serializes with the
   pass on shared cores; specdec/plan/calibrate.py). The planner's closed-loop tokens/s
   (specdec/plan/capacity.py) at each checked N is then set beside the measurement.

The costs file is the planner's input format (specdec/plan/capacity.py's docstring), with the check under
"check".
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import platform
import random
import statistics
import sys
import time

import torch

from specdec.benchmark import flags
from specdec.plan import closed_loop_tokens_per_s, load_costs, overhead_line

STREAMS = (1, 4, 16)  # checked
CALIBRATION = (2, 8)  # fit the round overhead, never checked
POOL = "specdec-bench-plan"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.plan_costs", description=__doc__.splitlines()[0])
    flags.add_target_model(p)
    p.add_argument("--rows", default="1,2,4,8,16", help="rows a pass, comma separated (default 1,2,4,8,16)")
    p.add_argument("--tokens-per-row", default="1,5", help="positions a row, comma separated (default 1,5)")
    p.add_argument("--prefill", default="32,96,192", help="prompt lengths to prefill (default 32,96,192)")
    p.add_argument("--context", type=int, default=96, help="tokens a session holds before the timed passes")
    p.add_argument("--passes", type=int, default=6, help="timed passes a cell; the median counts (default 6)")
    flags.add_repeats(p, 3, "repeats of each checked level")
    flags.add_max_new_tokens(p, 32, "tokens a request in the check")
    p.add_argument(
        "--requests-per-stream", type=int, default=3, help="requests each stream sends back to back (default 3)"
    )
    p.add_argument("--no-check", action="store_true", help="measure the costs only")
    flags.add_json(p, "write the costs file here")
    return p.parse_args(argv)


def measure_costs(args: argparse.Namespace, loaded) -> dict:
    from specdec.benchmark.prompts import FREE_PROSE_PROMPTS
    from specdec.core.acceptance import DraftProposal
    from specdec.core.sampling import SamplingParams
    from specdec.target_service.verifier import TargetVerifier, VerifyItem

    verifier = TargetVerifier(loaded, kv_cache_bytes=1 << 30)
    text = " ".join(prompt for _, prompt in FREE_PROSE_PROMPTS) * 8
    ids = loaded.tokenizer(text)["input_ids"]
    greedy = SamplingParams()
    passes = []
    for rows in [int(r) for r in args.rows.split(",")]:
        for tokens in [int(t) for t in args.tokens_per_row.split(",")]:
            seqs = {f"p{rows}x{tokens}-{i}": [*ids[: args.context - 1], 5 + i] for i in range(rows)}

            def step() -> None:
                # Drafts the target rejects (greedy): each row still costs `tokens` positions.
                items = [VerifyItem(s, t, DraftProposal([7] * (tokens - 1)), greedy) for s, t in seqs.items()]
                for tokens_of, result in zip(seqs.values(), verifier.verify_batch(items)):
                    tokens_of.extend(result.accepted_ids)

            step()  # prefill
            step()  # warm
            walls = []
            for _ in range(args.passes):
                started = time.perf_counter()
                step()
                walls.append(1000 * (time.perf_counter() - started))
            for s in seqs:
                verifier.end_session(s)
            passes.append({"rows": rows, "tokens_per_row": tokens, "ms": statistics.median(walls)})
            print(f"pass {rows:>3} rows x {tokens} positions: {passes[-1]['ms']:7.1f} ms", file=sys.stderr)
    prefill = []
    for length in [int(n) for n in args.prefill.split(",")]:
        walls = []
        for i in range(args.passes):
            session = f"f{length}-{i}"
            started = time.perf_counter()
            verifier.verify_batch([VerifyItem(session, ids[i : i + length], DraftProposal([]), greedy)])
            walls.append(1000 * (time.perf_counter() - started))
            verifier.end_session(session)
        prefill.append({"tokens": length, "ms": statistics.median(walls[1:])})
        print(f"prefill {length:>4} tokens: {prefill[-1]['ms']:7.1f} ms", file=sys.stderr)
    return {"pass_ms": passes, "prefill_ms": prefill}


async def measure_levels(args: argparse.Namespace, prompts: list[list[int]]) -> dict[int, list[dict]]:
    """Each level's closed-loop runs through the local stack, --repeats times in a seeded order."""
    from specdec.benchmark.concurrency import run_level
    from specdec.benchmark.stack import coordinators
    from specdec.coordinator.engine import EngineConfig
    from specdec.coordinator.server import ServerConfig
    from specdec.local.stack import LocalStack, StackConfig

    config = EngineConfig(default_draft_tokens=8, max_draft_tokens=16)
    stack_config = StackConfig(
        target_model=args.target_model, draft_model="ngram", pool_name=POOL, server=ServerConfig(port=0), engine=config
    )
    levels_run = STREAMS + CALIBRATION
    runs: dict[int, list[dict]] = {n: [] for n in levels_run}
    async with (
        LocalStack(stack_config) as stack,
        coordinators(stack, args.target_model, {"off": (config, None)}) as stubs,
    ):
        await run_level(stubs["off"], False, 4, prompts, 8, 8)  # warm-up: allocator, connections
        order = random.Random(0)
        for repeat in range(args.repeats):
            for n in order.sample(levels_run, len(levels_run)):
                print(f"repeat {repeat + 1}/{args.repeats}: {n} streams", file=sys.stderr, flush=True)
                # run_level gives each stream len(prompts) // n of them in turn.
                level = prompts * math.ceil(args.requests_per_stream * n / len(prompts))
                runs[n].append(await run_level(stubs["off"], False, n, level, args.max_new_tokens, 8))
    return runs


async def check(args: argparse.Namespace, tokenizer, costs_path: str) -> dict:
    from specdec.bench.engine_load import SHORT_PROMPTS

    prompts = [tokenizer(text)["input_ids"] for text in SHORT_PROMPTS]
    runs = await measure_levels(args, prompts)
    prompt_tokens = round(statistics.mean(len(p) for p in prompts))
    measured = {n: statistics.median(r["tokens_per_s"] for r in rs) for n, rs in runs.items()}
    calibration = {n: measured[n] for n in CALIBRATION}
    fixed, per_row, at = overhead_line(load_costs(costs_path), calibration, prompt_tokens, args.max_new_tokens)
    with open(costs_path) as f:
        raw = json.load(f)
    raw["round_overhead_ms"], raw["round_overhead_per_row_ms"] = fixed, per_row
    with open(costs_path, "w") as f:
        json.dump(raw, f, indent=1)
    costs = load_costs(costs_path)
    levels = {}
    for n in STREAMS:
        rs = runs[n]
        predicted = closed_loop_tokens_per_s(costs, n, prompt_tokens, args.max_new_tokens, 0.0, 0)
        levels[str(n)] = {
            "measured_tokens_per_s": measured[n],
            "measured_repeats": [r["tokens_per_s"] for r in rs],
            "predicted_tokens_per_s": predicted,
            "error": predicted / measured[n] - 1,
            "tpot_ms_p50": statistics.median(r["tpot_ms_p50"] for r in rs),
            "ttft_ms_p50": statistics.median(r["ttft_ms_p50"] for r in rs),
        }
    return {
        "calibration": {
            str(n): {"measured_tokens_per_s": measured[n], "round_overhead_ms": at[n]} for n in CALIBRATION
        },
        "round_overhead_ms": fixed,
        "round_overhead_per_row_ms": per_row,
        "prompt_tokens": prompt_tokens,
        "output_tokens": args.max_new_tokens,
        "levels": levels,
    }


def main(argv: list[str] | None = None) -> int:
    from specdec.benchmark.provenance import git_commit
    from specdec.runtime.loading import load_model

    args = parse_args(argv)
    path = args.json or "/tmp/specdec_plan_costs.json"
    loaded = load_model(args.target_model)
    costs = {
        "kind": "specdec plan costs",
        **measure_costs(args, loaded),
        "round_overhead_ms": 0.0,
        "draft_tokens": 0,
        "max_batch": 64,
        "acceptance": {},
    }
    costs["config"] = {
        **vars(args),
        "model": loaded.name,
        "cpus": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    with open(path, "w") as f:
        json.dump(costs, f, indent=1)
    if args.no_check:
        return 0
    result = asyncio.run(check(args, loaded.tokenizer, path))
    with open(path) as f:
        costs = json.load(f)
    costs["check"] = result
    with open(path, "w") as f:
        json.dump(costs, f, indent=1)
    print(
        f"round overhead (calibrated at {' and '.join(map(str, CALIBRATION))} streams): "
        f"{result['round_overhead_ms']:.1f} ms + {result['round_overhead_per_row_ms']:.2f} ms a stream"
    )
    for n, level in result["levels"].items():
        print(
            f"{n:>3} streams: measured {level['measured_tokens_per_s']:6.1f} tokens/s, "
            f"predicted {level['predicted_tokens_per_s']:6.1f} ({100 * level['error']:+.0f}%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
