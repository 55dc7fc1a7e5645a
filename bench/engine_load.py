"""The target engine under load: aggregate tokens/s of N concurrent streams through the stack.

  python -m specdec.bench.engine_load [--repeats 3] [--max-new-tokens 48] [--json PATH]

One local stack (what `specdec up` runs: the n-gram draft server, one target actor on a local
Ray, coordinators in this process over gRPC on loopback), greedy, EOS off (every request makes
exactly --max-new-tokens tokens). Each cell is N streams, each running its share of a prompt set
back to back (specdec/benchmark/concurrency.py), speculation off unless named:

  short   four short free-text prompts written for this benchmark (about 96 tokens each; not
          in the suite, the distillation corpus or any tuning): 1 and 16 streams
  mixed   the suite's mixed workload (copy and free prompts of 200-280 tokens): 1 and 16 streams,
          and at 64 streams speculation off next to the load-aware arm (a speculation token
          budget of 16 target positions per pass shared by the generating requests)

Cells run in a fresh seeded order each repeat, so drift on the machine hits them alike; figures
are medians over repeats of each cell's tokens/s, and ratios are of those medians. The outputs of
every cell are checked against each other token for token (greedy: batching must not change
them).
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

import torch

from specdec.benchmark import flags
from specdec.benchmark.concurrency import run_level
from specdec.benchmark.prompts import suite_workload
from specdec.benchmark.provenance import git_commit
from specdec.benchmark.stack import coordinators
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.server import ServerConfig
from specdec.local.stack import LocalStack, StackConfig
from specdec.runtime.loading import load_model

POOL = "specdec-bench-engine"
SHORT_PROMPTS = (
    "The lighthouse keeper had kept a logbook for thirty-one years, and on most pages the entries "
    "were the same: wind from the west, two ships, lamp trimmed at dusk. The entry for the night of "
    "the storm was different. It ran to four pages, written in a hand that grew steadier as it went, "
    "and it began with a sentence he had underlined twice:",
    "When you move a small bakery from hand-written orders to a shared spreadsheet, the first week is "
    "mostly about habits rather than software. Bakers who have memorised every regular customer's "
    "usual loaf will resist typing it in, and the counter staff will forget to mark orders as "
    "collected. A few rules help more than any feature:",
    "Photosynthesis is often taught as a single equation, but inside a leaf it is two linked "
    "processes running at different speeds. The light reactions happen in the thylakoid membranes "
    "and turn sunlight into chemical energy within milliseconds, while the Calvin cycle in the "
    "stroma spends that energy to fix carbon, much more slowly. To see why the split matters,",
    "Our hiking club's route for Saturday climbs from the old mill car park to the ridge above the "
    "reservoir, about eleven kilometres with five hundred metres of ascent. The path is rocky after "
    "the second stile and can be slippery when wet, so walking poles are a good idea. Before you "
    "sign up, please read the following notes about timing, kit and transport:",
)
CELLS = (
    ("short", 1, "off"),
    ("short", 16, "off"),
    ("mixed", 1, "off"),
    ("mixed", 16, "off"),
    ("mixed", 64, "off"),
    ("mixed", 64, "load_aware"),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.engine_load", description=__doc__.splitlines()[0])
    flags.add_repeats(p, 3)
    flags.add_max_new_tokens(p, 48)
    p.add_argument("--mixed-prompts", type=int, default=4, help="prompts of the mixed workload (default 4)")
    flags.add_target_model(p)
    flags.add_json(p)
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> dict:
    target = load_model(args.target_model)
    prompts = {
        "short": [target.tokenizer(text)["input_ids"] for text in SHORT_PROMPTS],
        "mixed": [target.tokenizer(text)["input_ids"] for _, text in suite_workload("mixed", args.mixed_prompts)],
    }
    config = EngineConfig(default_draft_tokens=8, max_draft_tokens=16)
    arms = {"off": (config, None), "load_aware": (replace(config, speculation_token_budget=16), None)}
    stack_config = StackConfig(
        target_model=args.target_model, draft_model="ngram", pool_name=POOL, server=ServerConfig(port=0), engine=config
    )
    runs: dict[tuple[str, int, str], list[dict]] = {cell: [] for cell in CELLS}
    async with LocalStack(stack_config) as stack, coordinators(stack, args.target_model, arms) as stubs:
        await run_level(stubs["off"], False, 4, prompts["short"], 8, 8)  # warm-up: allocator, connections
        order = random.Random(0)
        for repeat in range(args.repeats):
            for cell in order.sample(CELLS, len(CELLS)):
                workload, streams, arm = cell
                print(f"repeat {repeat + 1}/{args.repeats}: {workload} x{streams} {arm}", file=sys.stderr, flush=True)
                result = await run_level(stubs[arm], arm != "off", streams, prompts[workload], args.max_new_tokens, 8)
                runs[cell].append(result)
    cells = {
        f"{workload}/{streams}/{arm}": {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
            "tokens_per_s_repeats": [r["tokens_per_s"] for r in rs],
            "tpot_ms_p50": statistics.median(r["tpot_ms_p50"] for r in rs),
            "ttft_ms_p50": statistics.median(r["ttft_ms_p50"] for r in rs),
        }
        for (workload, streams, arm), rs in runs.items()
    }
    outputs: dict[tuple[str, int], list[int]] = {}
    equal = True
    for (workload, _, _), rs in runs.items():
        for r in rs:
            for prompt, ids in r["outputs"]:
                equal &= outputs.setdefault((workload, prompt), ids) == ids

    def ratio(a: str, b: str) -> float:
        return cells[a]["tokens_per_s"] / cells[b]["tokens_per_s"]

    return {
        "config": {
            **vars(args),
            "model": target.name,
            "cpus": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
        "cells": cells,
        "ratios": {
            "short 16 / 1 streams": ratio("short/16/off", "short/1/off"),
            "mixed 16 / 1 streams": ratio("mixed/16/off", "mixed/1/off"),
            "mixed 64 streams load-aware / off": ratio("mixed/64/load_aware", "mixed/64/off"),
        },
        "outputs_equal": equal,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = asyncio.run(run(args))
    for name, cell in results["cells"].items():
        repeats = ", ".join(f"{t:.1f}" for t in cell["tokens_per_s_repeats"])
        print(f"{name:<24} {cell['tokens_per_s']:7.1f} tokens/s  ({repeats})  TPOT p50 {cell['tpot_ms_p50']:.0f} ms")
    for name, value in results["ratios"].items():
        print(f"{name:<36} {value:.2f}x")
    print(f"greedy outputs equal across cells: {results['outputs_equal']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if results["outputs_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
