"""Full-stack benchmark: the distributed stack at batch 1 next to the single-process engine.

For each drafter, one run measures on the same prompts, side by side (the methods of a prompt
interleaved within each repeat, in a fresh seeded order each repeat):
  single_k0     the single-process engine (`specdec generate --in-process`), k = 0
  single_spec   the single-process engine with speculation (pipelined, as served)
  stack_k0      the local stack over gRPC, speculation disabled in the request: the baseline
  stack_spec    the local stack with speculation: the pipelined coordinator, the default
  stack_serial  the same stack behind a second coordinator with pipelining off

The stack is what `specdec up` runs: a draft server subprocess, the target actor on a local Ray
and the coordinator in this process, called over gRPC on loopback like any client. Every method
decodes greedily and generates exactly --max-new-tokens tokens (EOS off, as in
bench/single_process.py), and every output is checked against single_k0 token for token.

Drafters (--drafter, repeatable): `ngram` (prompt lookup, no model), `first:N` (a draft cut
from the target: its first N layers and final norm, untrained, specdec/drafts/truncate.py; no
smaller model sharing Gemma 3's tokenizer ships here), or any model spec.

Where the time goes comes from the engine's own clocks (SpeculationStats): waiting for drafts,
waiting for verification, the coordinator's own work in between, and, for the stack, what lies
outside the engine (gRPC, tokenization, the client).

  python -m specdec.bench.stack [flags]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import random
import statistics
import sys
import time
from dataclasses import replace

import torch
from tqdm import tqdm

from specdec.bench.flags import add_workload_flags, require_positive
from specdec.benchmark import flags
from specdec.benchmark.prompts import WORKLOADS, workload
from specdec.benchmark.provenance import git_commit
from specdec.benchmark.stack import Method, Run, coordinators, drafter_spec, stack_method
from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.coordinator.server import ServerConfig
from specdec.draft_service.registry import draft_model
from specdec.drafts import loading as draft_loading
from specdec.local.in_process import build_engine
from specdec.local.stack import LocalStack, StackConfig
from specdec.runtime.loading import load_model

METHODS = ("single_k0", "single_spec", "stack_k0", "stack_spec", "stack_serial")
DEFAULT_K = 8  # as bench/single_process.py
POOL = "specdec-bench-stack"


def single_method(engine: SpeculativeEngine, speculate: bool, k: int) -> Method:
    async def run(prompt_ids: list[int], max_new_tokens: int) -> Run:
        request = GenerationRequest(
            prompt_token_ids=prompt_ids, max_new_tokens=max_new_tokens, speculate=speculate, max_draft_tokens=k
        )
        started = time.perf_counter()
        result = await engine.generate(request)
        seconds = time.perf_counter() - started
        s = result.stats
        return Run(
            result.token_ids,
            seconds,
            s.rounds,
            s.draft_tokens,
            s.accepted_tokens,
            s.pipelined_rounds,
            s.draft_wait_s,
            s.verify_wait_s,
            s.seconds,
        )

    return run


def bench_prompt(runs_by_method: dict[str, list[Run]]) -> dict:
    """Medians over repeats of one prompt's runs, ratios, time split and equality."""
    med = statistics.median
    reference = runs_by_method["single_k0"][0].token_ids
    tps = {name: med(len(run.token_ids) / run.seconds for run in runs) for name, runs in runs_by_method.items()}
    split = {
        name: {part: med(run.split()[part] for run in runs) for part in ("draft", "verify", "coordinator", "outside")}
        for name, runs in runs_by_method.items()
    }
    verify_ms = {
        name: med(1000 * run.verify_wait_s / run.rounds for run in runs) for name, runs in runs_by_method.items()
    }
    spec = runs_by_method["stack_spec"][-1]  # greedy: the same rounds in every repeat
    return {
        "new_tokens": len(reference),
        "tokens_per_s": tps,
        "seconds": {name: [run.seconds for run in runs] for name, runs in runs_by_method.items()},
        "time_split": split,
        "verify_ms_per_round": verify_ms,
        "stack_over_single": tps["stack_spec"] / tps["single_spec"],
        "stack_over_single_k0": tps["stack_k0"] / tps["single_k0"],
        "speedup_stack": tps["stack_spec"] / tps["stack_k0"],
        "speedup_single": tps["single_spec"] / tps["single_k0"],
        "pipelining_gain": tps["stack_spec"] / tps["stack_serial"],
        "acceptance_rate": spec.accepted_tokens / spec.draft_tokens if spec.draft_tokens else 0.0,
        "tokens_per_round": len(reference) / spec.rounds,
        "rounds": spec.rounds,
        "pipelined_rounds": spec.pipelined_rounds,
        "greedy_equal": {
            name: all(run.token_ids == reference for run in runs) for name, runs in runs_by_method.items()
        },
        "token_ids": reference,
    }


_RATIOS = (
    "stack_over_single",
    "stack_over_single_k0",
    "speedup_stack",
    "speedup_single",
    "pipelining_gain",
    "acceptance_rate",
    "tokens_per_round",
)


def summarize(rows: list[dict]) -> dict:
    med = statistics.median
    out = {name: med(row[name] for row in rows) for name in _RATIOS}
    out["tokens_per_s"] = {m: med(row["tokens_per_s"][m] for row in rows) for m in METHODS}
    out["time_split"] = {
        m: {part: med(row["time_split"][m][part] for row in rows) for part in rows[0]["time_split"][m]} for m in METHODS
    }
    out["verify_ms_per_round"] = {m: med(row["verify_ms_per_round"][m] for row in rows) for m in METHODS}
    out["greedy_equal"] = {m: all(row["greedy_equal"][m] for row in rows) for m in METHODS}
    out["prompts"] = len(rows)
    return out


async def bench_drafter(
    drafter: str, target, encoded: list[tuple[str, str, list[int]]], args, progress: tqdm
) -> list[dict]:
    """Every method on every prompt for one drafter; one local stack for all of them."""
    spec = drafter_spec(drafter, args.target_model)
    config = EngineConfig(default_draft_tokens=args.k, max_draft_tokens=max(args.k, 16), adaptive=args.adaptive)
    # EOS off everywhere: every method then generates exactly max_new_tokens tokens.
    single = build_engine(
        replace(target, eos_token_ids=frozenset()),
        None if draft_model(spec) is None else draft_loading.load_model(spec),
        config,
    )
    stack_config = StackConfig(
        target_model=args.target_model, draft_model=spec, pool_name=POOL, server=ServerConfig(port=0), engine=config
    )
    async with LocalStack(stack_config) as stack:
        arms = {"pipelined": (replace(config, pipeline=True), None), "serial": (replace(config, pipeline=False), None)}
        async with coordinators(stack, args.target_model, arms) as stubs:
            methods: dict[str, Method] = {
                "single_k0": single_method(single, False, args.k),
                "single_spec": single_method(single, True, args.k),
                "stack_k0": stack_method(stubs["pipelined"], False, args.k),
                "stack_spec": stack_method(stubs["pipelined"], True, args.k),
                "stack_serial": stack_method(stubs["serial"], True, args.k),
            }
            for method in methods.values():  # first calls pay for allocator growth, lazy init, connections
                await method(encoded[0][2], min(args.max_new_tokens, 8))
            order = random.Random(0)
            rows = []
            for name, label, ids in encoded:
                progress.set_postfix_str(f"{drafter} {name}/{label}")
                runs: dict[str, list[Run]] = {m: [] for m in METHODS}
                for _ in range(args.repeats):
                    for m in order.sample(METHODS, len(METHODS)):
                        runs[m].append(await methods[m](ids, args.max_new_tokens))
                        progress.update()
                rows.append(
                    {
                        "drafter": drafter,
                        "workload": name,
                        "label": label,
                        "prompt_tokens": len(ids),
                        **bench_prompt(runs),
                    }
                )
            return rows


_HEADER = (
    f"{'prompt':<30} {'single0':>8} {'single':>8} {'stack0':>8} {'stack':>8} {'serial':>8} "
    f"{'stack x':>7} {'st/si':>6} {'st0/si0':>7} {'pipe x':>6} {'accept':>6} {'tok/rnd':>7} {'equal':>5}"
)


def _line(label: str, row: dict) -> str:
    t = row["tokens_per_s"]
    equal = all(row["greedy_equal"].values())
    return (
        f"{label[:30]:<30} {t['single_k0']:>8.2f} {t['single_spec']:>8.2f} "
        f"{t['stack_k0']:>8.2f} {t['stack_spec']:>8.2f} {t['stack_serial']:>8.2f} "
        f"{row['speedup_stack']:>6.2f}x {row['stack_over_single']:>6.2f} "
        f"{row['stack_over_single_k0']:>7.2f} {row['pipelining_gain']:>5.2f}x "
        f"{row['acceptance_rate']:>6.0%} {row['tokens_per_round']:>7.2f} {'yes' if equal else 'NO':>5}"
    )


def print_tables(results: dict, out=None) -> None:
    out = out or sys.stdout  # looked up per call: a captured stdout may have closed since import
    repeats = results["config"]["repeats"]
    for drafter, by_workload in results["summary"].items():
        for name, summary in by_workload.items():
            print(f"\n== drafter {drafter}, workload {name} (tokens/s, median of {repeats} repeats) ==", file=out)
            print(_HEADER, file=out)
            for row in results["prompts"]:
                if row["drafter"] == drafter and row["workload"] == name:
                    print(_line(row["label"], row), file=out)
            print(_line("median", summary), file=out)
        overall = results["overall"][drafter]
        print(f"\n-- drafter {drafter}: where the time goes (share of wall time, median over prompts) --", file=out)
        print(
            f"{'method':<14} {'draft':>6} {'verify':>6} {'coord':>6} {'outside':>7} {'verify ms/round':>15}", file=out
        )
        for m in METHODS:
            s = overall["time_split"][m]
            print(
                f"{m:<14} {s['draft']:>6.1%} {s['verify']:>6.1%} {s['coordinator']:>6.1%} {s['outside']:>7.1%} "
                f"{overall['verify_ms_per_round'][m]:>15.1f}",
                file=out,
            )
    bad = [
        f"{r['drafter']} {r['workload']}/{r['label']}"
        for r in results["prompts"]
        if not all(r["greedy_equal"].values())
    ]
    if bad:
        print("\nGREEDY EQUALITY FAILED (tokens differ from single_k0): " + "; ".join(bad), file=out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    p = argparse.ArgumentParser(
        prog="python -m specdec.bench.stack",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--drafter",
        action="append",
        default=None,
        help="ngram, first:N (the target's first N layers) or a model spec; repeatable (default: ngram and first:4)",
    )
    flags.add_max_new_tokens(p, 64)
    flags.add_repeats(p, 3)
    flags.add_k(p, DEFAULT_K)
    p.add_argument("--adaptive", action="store_true", help="adaptive k (at most --k) instead of k = --k every round")
    add_workload_flags(p)
    args = p.parse_args(argv)
    args.drafter = args.drafter or ["ngram", "first:4"]
    require_positive(p, args, ("max_new_tokens", "repeats", "k", "prompts"))
    return args


async def run(args: argparse.Namespace) -> dict:
    names = WORKLOADS if args.workload == "all" else (args.workload,)
    target = load_model(args.target_model)
    encoded = []
    for name in names:
        for label, text in workload(name, args.prompts):
            ids = target.tokenizer(text)["input_ids"]
            encoded.append((name, label, ids[-args.max_prompt_tokens :] if args.max_prompt_tokens else ids))
    rows = []
    with tqdm(
        total=len(args.drafter) * len(encoded) * args.repeats * len(METHODS),
        desc="bench stack",
        unit="run",
        file=sys.stderr,
    ) as progress:
        for drafter in args.drafter:
            rows += await bench_drafter(drafter, target, encoded, args, progress)
    return {
        "config": {
            **vars(args),
            "model": target.name,
            "methods": list(METHODS),
            "cpus": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
        "prompts": rows,
        "summary": {
            d: {w: summarize([r for r in rows if r["drafter"] == d and r["workload"] == w]) for w in names}
            for d in args.drafter
        },
        "overall": {d: summarize([r for r in rows if r["drafter"] == d]) for d in args.drafter},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = asyncio.run(run(args))
    print_tables(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(all(r["greedy_equal"].values()) for r in results["prompts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
