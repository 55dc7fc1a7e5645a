"""Drafters side by side on tuning and held-out prompts, through the stack: which one should
`auto` be?

For each kind of workload (specdec/benchmark/heldout.py: repeated, free, copy) and each of its two sets
(tuning, held-out), the set's requests are served one after another, as similar requests come
to a server; for each request every arm runs once, in a fresh seeded order. Arms:

  target_only   the stack with speculation off (the baseline)
  ngram         prompt lookup (the n-gram drafter)
  suffix        suffix decoding over the request and earlier completions (no model)
  SPEC          any other drafter spec, e.g. hybrid:distilled or suffix:distilled (--arm)
  SPEC+tree     that drafter with the coordinator's token trees on (--token-tree): suffix
                drafting answers trees of up to k nodes, verified in one pass
  ARM@K         that arm with its requests drafting up to K tokens a round (the others: --k),
                e.g. suffix@16: how the default k (--default-draft-tokens) pays, side by side

Each arm has its own draft server, and a drafter that learns from completions (suffix, suffix:*)
gets a fresh one for every set and pass, so its cache holds only what that arm served earlier in
that set: never the same request's own earlier output. Each pass is one sweep; a figure is the
median over passes of the arm's tokens/s over the whole set (all tokens over all seconds).
Greedy, EOS off (every request generates exactly --max-new-tokens), and every output is
compared with target-only token for token.

  python -m specdec.bench.drafters [--arm SPEC ...] [--passes N] [--json PATH]
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
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from specdec.benchmark import flags, heldout
from specdec.benchmark.provenance import git_commit
from specdec.benchmark.stack import Run, coordinators, stack_method
from specdec.coordinator.clients import DraftClient
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.server import ServerConfig
from specdec.core.sampling import SamplingParams
from specdec.draft_service.hybrid import uses_suffix
from specdec.local.stack import LocalStack, StackConfig, draft_server_ready, spawn_draft_server, terminate
from specdec.runtime.loading import load_tokenizer

POOL = "specdec-bench-drafters"
TREE = "+tree"  # an arm suffix: the coordinator asks for token trees
AT = "@"  # an arm suffix: @K, its requests' most draft tokens a round


def _drafter(arm: str) -> str:
    """The draft server's spec of an arm."""
    return arm.split(AT)[0].removesuffix(TREE)


def _tree(arm: str) -> bool:
    return arm.split(AT)[0].endswith(TREE)


def _k(arm: str, default: int) -> int:
    """The most draft tokens an arm's requests ask for."""
    return int(arm.split(AT)[1]) if AT in arm else default


BASELINE = "target_only"
DEFAULT_ARMS = ("ngram", "suffix", "hybrid:distilled", "suffix:distilled")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m specdec.bench.drafters",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--arm", action="append", help=f"drafter specs, repeatable (default: {', '.join(DEFAULT_ARMS)})")
    p.add_argument("--kind", action="append", choices=("repeated", "free", "copy"), help="workloads (default: all)")
    p.add_argument("--passes", type=int, default=2, help="sweeps over every set; figures are medians (default 2)")
    flags.add_prompts(p, 8, "the most requests per set")
    flags.add_max_new_tokens(p, 48)
    flags.add_k(p, 8)
    flags.add_max_prompt_tokens(p)
    flags.add_target_model(p)
    flags.add_json(p)
    args = p.parse_args(argv)
    args.arm = list(dict.fromkeys(args.arm or DEFAULT_ARMS))
    if "ngram" not in args.arm:
        args.arm.insert(0, "ngram")  # every ratio is also reported over prompt lookup
    args.kind = list(dict.fromkeys(args.kind or ("repeated", "free", "copy")))
    for name in ("passes", "prompts", "max_new_tokens", "k"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for arm in args.arm:
        k = arm.split(AT)[1] if AT in arm else "1"
        if not k.isdigit() or not 1 <= int(k) <= 16:
            p.error(f"--arm {arm}: the K of ARM@K must be an integer in [1, 16] (what a draft server serves)")
    return args


async def _draft_servers(specs: list[str], warm_up: list[int]) -> tuple[dict, dict[str, DraftClient]]:
    """A fresh draft server per spec, each warmed up by one Propose (a first model step pays for
    allocations) whose session ends with no completion: a suffix cache starts empty."""
    servers = {spec: await spawn_draft_server(_drafter(spec)) for spec in specs}
    clients = {spec: DraftClient((await draft_server_ready(server))[0]) for spec, server in servers.items()}
    for client in clients.values():
        await client.propose("warm-up", warm_up, 8, SamplingParams())
        await client.end_session("warm-up")
    return servers, clients


async def _close(servers: dict, clients: dict[str, DraftClient]) -> None:
    for client in clients.values():
        await client.close()
    for server in servers.values():
        await terminate(server)


async def measure(args: argparse.Namespace) -> dict:
    tokenizer = load_tokenizer(args.target_model)
    sets = heldout.sets()

    def ids(text: str) -> list[int]:
        tokens = tokenizer(text)["input_ids"]
        return tokens[-args.max_prompt_tokens :] if args.max_prompt_tokens else tokens

    prompts = {
        (kind, name): [(label, ids(text)) for label, text in sets[kind][name][: args.prompts]]
        for kind in args.kind
        for name in ("tuning", "heldout")
    }
    config = EngineConfig(default_draft_tokens=args.k, max_draft_tokens=max(args.k, 16), adaptive=True)
    stack_config = StackConfig(
        target_model=args.target_model,
        draft_model="ngram",
        pool_name=POOL,
        metrics_port=0,
        server=ServerConfig(port=0),
        engine=config,
    )
    learners = [spec for spec in args.arm if uses_suffix(_drafter(spec))]
    fixed = [spec for spec in args.arm if spec != "ngram" and spec not in learners]
    order = random.Random(0)
    first = True
    runs: dict[tuple[str, str], list[dict[str, list[Run]]]] = {key: [] for key in prompts}
    total = args.passes * sum(len(rows) for rows in prompts.values()) * (len(args.arm) + 1)
    async with LocalStack(stack_config) as stack:
        warm_up = next(iter(prompts.values()))[0][1]
        fixed_servers, fixed_clients = await _draft_servers(fixed, warm_up)
        try:
            with tqdm(total=total, desc="drafters", unit="run", file=sys.stderr) as progress:
                for _ in range(args.passes):
                    for key, rows in prompts.items():
                        servers, clients = await _draft_servers(learners, warm_up)  # empty caches for every set
                        try:
                            drafts = fixed_clients | clients
                            arms = {spec: (replace(config, token_tree=_tree(spec)), None) for spec in args.arm}
                            async with coordinators(stack, args.target_model, arms, drafts) as stubs:
                                methods = {BASELINE: stack_method(stubs["ngram"], False, args.k)}
                                for spec in args.arm:
                                    methods[spec] = stack_method(stubs[spec], True, _k(spec, args.k))
                                # First calls pay for lazy init; a learner's would fill its cache.
                                for name in [m for m in methods if m not in learners] if first else []:
                                    await methods[name](warm_up, 4)
                                first = False
                                sweep: dict[str, list[Run]] = {name: [] for name in methods}
                                for label, ids in rows:
                                    progress.set_postfix_str(f"{key[0]}/{key[1]}/{label}"[:50])
                                    for name in order.sample(list(methods), len(methods)):
                                        sweep[name].append(await methods[name](ids, args.max_new_tokens))
                                        progress.update()
                                runs[key].append(sweep)
                        finally:
                            await _close(servers, clients)
        finally:
            await _close(fixed_servers, fixed_clients)
    return _summarize(args, prompts, runs)


def _summarize(args, prompts, runs) -> dict:
    med = statistics.median
    out: dict = {"sets": {}}
    equal = True
    for key, sweeps in runs.items():
        reference = [run.token_ids for run in sweeps[0][BASELINE]]
        tps = {name: med(_tokens_per_s(sweep[name]) for sweep in sweeps) for name in sweeps[0]}
        same = {name: all([r.token_ids for r in sweep[name]] == reference for sweep in sweeps) for name in sweeps[0]}
        equal = equal and all(same.values())
        accepted = {
            name: sum(r.accepted_tokens for sweep in sweeps for r in sweep[name])
            / max(1, sum(r.draft_tokens for sweep in sweeps for r in sweep[name]))
            for name in args.arm
        }
        out["sets"][f"{key[0]}/{key[1]}"] = {
            "requests": [label for label, _ in prompts[key]],
            "tokens_per_s": tps,
            "speedup": {name: tps[name] / tps[BASELINE] for name in args.arm},
            "over_ngram": {name: tps[name] / tps["ngram"] for name in args.arm},
            "acceptance": accepted,
            "greedy_equal": same,
            "seconds": {name: [[r.seconds for r in sweep[name]] for sweep in sweeps] for name in sweeps[0]},
        }
    out["greedy_equal"] = equal
    out["auto"] = choose_auto(out["sets"], args.arm)
    out["config"] = {
        **vars(args),
        "commit": git_commit(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    return out


AUTO_FLOOR = 0.97  # the default may lose at most 3% to prompt lookup on any held-out set


def choose_auto(sets: dict, arms: list[str]) -> dict:
    """The drafter `auto` should be, judged on the held-out sets only: of the arms within
    AUTO_FLOOR of n-gram lookup on every held-out set, the highest geometric-mean speedup over
    target-only (when none is, the one whose worst held-out set is best)."""
    held = [row for name, row in sets.items() if name.endswith("/heldout")]
    scores = {}
    for arm in arms:
        worst = min(row["over_ngram"][arm] for row in held)
        mean = statistics.geometric_mean(row["speedup"][arm] for row in held)
        scores[arm] = {"worst_over_ngram": worst, "geomean_speedup": mean}
    eligible = [arm for arm in arms if scores[arm]["worst_over_ngram"] >= AUTO_FLOOR]
    if eligible:
        chosen = max(eligible, key=lambda arm: scores[arm]["geomean_speedup"])
    else:
        chosen = max(arms, key=lambda arm: scores[arm]["worst_over_ngram"])
    return {"chosen": chosen, "floor": AUTO_FLOOR, "scores": scores}


def _tokens_per_s(runs: list[Run]) -> float:
    return sum(len(r.token_ids) for r in runs) / sum(r.seconds for r in runs)


def print_report(results: dict) -> None:
    arms = results["config"]["arm"]
    print(f"{'set':<20} {'target tok/s':>12} " + " ".join(f"{a[:18]:>18}" for a in arms))
    for name, row in results["sets"].items():
        cells = " ".join(
            f"{row['speedup'][a]:>6.2f}x {row['over_ngram'][a]:>5.2f}n {row['acceptance'][a]:>4.0%}" for a in arms
        )
        print(f"{name:<20} {row['tokens_per_s'][BASELINE]:>12.2f} {cells}")
    print("cells: speedup over target-only, ratio over ngram (n), draft acceptance")
    print("greedy outputs equal to target-only:", results["greedy_equal"])
    auto = results["auto"]
    for arm, score in auto["scores"].items():
        print(
            f"held-out: {arm:<22} worst over ngram {score['worst_over_ngram']:.2f}x, "
            f"geometric mean speedup {score['geomean_speedup']:.2f}x"
        )
    print(f"auto, chosen on held-out prompts (within {auto['floor']:.2f}x of ngram everywhere): {auto['chosen']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = asyncio.run(measure(args))
    print_report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if results["greedy_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
