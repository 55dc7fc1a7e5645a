"""Single-process benchmark: our engine (target-only and n-gram drafter) next to transformers'
own greedy and prompt-lookup decoding, on the same prompts, in one run.

Four methods per prompt, interleaved within each repeat (in a fresh seeded order each repeat)
so machine noise hits all of them alike:
  ours_k0     our engine with speculation off (k = 0): plain decoding through our stack
  ours_ngram  our engine with the n-gram (prompt-lookup) drafter, k = --k
  hf_greedy   model.generate(do_sample=False)
  hf_pld      model.generate(do_sample=False, prompt_lookup_num_tokens=--k), the peer

All four decode greedily and produce exactly --max-new-tokens tokens: EOS is switched off for
every method (our engine gets the target with no eos ids, transformers gets eos_token_id=None),
so no method stops early and every token/s figure divides the same count. Suppressing EOS with
min_new_tokens instead would change transformers' argmax at positions where EOS wins and break
the token-for-token comparison. All methods get the same prompt token ids, and every output is
checked against ours_k0: greedy speculation must not change a single token.

  python -m specdec.bench.single_process [flags]
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
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from tqdm import tqdm

from specdec.bench.flags import add_workload_flags, require_positive
from specdec.benchmark import flags
from specdec.benchmark.prompts import WORKLOADS, workload
from specdec.benchmark.provenance import git_commit
from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculationStats
from specdec.local.in_process import build_engine, load_pair
from specdec.runtime.models import LoadedModel

METHODS = ("ours_k0", "ours_ngram", "hf_greedy", "hf_pld")
DEFAULT_K = 8  # best of 3..8 on copy prompts, even with 3 on free ones (bench/README.md, "Choosing k")


@dataclass
class Run:
    token_ids: list[int]
    seconds: float  # wall clock: what the tables show
    cpu_seconds: float  # this process's CPU time, all threads: less inflated by busy neighbours
    stats: SpeculationStats | None = None  # ours only


def _timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


Method = Callable[[list[int], int], Run]  # (prompt ids, max_new_tokens) -> Run


def make_methods(target: LoadedModel, k: int, runner: asyncio.Runner) -> dict[str, Method]:
    # No eos ids: our engine then stops only at max_new_tokens, like transformers with eos None.
    engine = build_engine(
        replace(target, eos_token_ids=frozenset()),
        None,
        EngineConfig(default_draft_tokens=k, max_draft_tokens=max(k, 16), adaptive=False),
    )
    model = target.model

    def ours(speculate: bool) -> Method:
        def run(prompt_ids: list[int], max_new_tokens: int) -> Run:
            request = GenerationRequest(
                prompt_token_ids=prompt_ids, max_new_tokens=max_new_tokens, speculate=speculate, max_draft_tokens=k
            )
            result, seconds, cpu = _timed(lambda: runner.run(engine.generate(request)))
            return Run(result.token_ids, seconds, cpu, result.stats)

        return run

    def hf(**kwargs) -> Method:
        def run(prompt_ids: list[int], max_new_tokens: int) -> Run:
            input_ids = torch.tensor([prompt_ids])  # (1, prompt)
            with torch.inference_mode():
                out, seconds, cpu = _timed(
                    lambda: model.generate(
                        input_ids,
                        attention_mask=torch.ones_like(input_ids),
                        do_sample=False,
                        max_new_tokens=max_new_tokens,
                        eos_token_id=None,
                        **kwargs,
                    )
                )  # out: (1, prompt + max_new_tokens)
            return Run(out[0, len(prompt_ids) :].tolist(), seconds, cpu)

        return run

    return {
        "ours_k0": ours(False),
        "ours_ngram": ours(True),
        "hf_greedy": hf(),
        "hf_pld": hf(prompt_lookup_num_tokens=k),
    }


def bench_prompt(methods: dict[str, Method], prompt_ids: list[int], args, order: random.Random, progress: tqdm) -> dict:
    """Time every method `repeats` times on one prompt; medians, speedups and equality."""
    runs: dict[str, list[Run]] = {name: [] for name in METHODS}
    for _ in range(args.repeats):
        # A fresh order each repeat: a fixed cyclic rotation would give each method the same
        # predecessor every time, and whatever one method leaves behind would bias the next.
        for name in order.sample(METHODS, len(METHODS)):
            runs[name].append(methods[name](prompt_ids, args.max_new_tokens))
            progress.update()
    reference = runs["ours_k0"][0].token_ids
    tokens_per_s = {
        name: statistics.median(len(run.token_ids) / run.seconds for run in rs) for name, rs in runs.items()
    }
    stats = runs["ours_ngram"][-1].stats  # greedy: identical in every repeat
    return {
        "prompt_tokens": len(prompt_ids),
        "new_tokens": len(reference),
        "tokens_per_s": tokens_per_s,
        "seconds": {name: [run.seconds for run in rs] for name, rs in runs.items()},
        "cpu_seconds": {name: [run.cpu_seconds for run in rs] for name, rs in runs.items()},
        "speedup_ours": tokens_per_s["ours_ngram"] / tokens_per_s["ours_k0"],
        "speedup_hf": tokens_per_s["hf_pld"] / tokens_per_s["hf_greedy"],
        "acceptance_rate": stats.acceptance_rate,
        "tokens_per_round": (stats.accepted_tokens + stats.rounds) / stats.rounds,
        "rounds": stats.rounds,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "accepted_per_position": stats.accepted_per_position,
        "greedy_equal": {name: all(run.token_ids == reference for run in rs) for name, rs in runs.items()},
        "token_ids": reference,
    }


def summarize(rows: list[dict]) -> dict:
    """Medians over prompts of every per-prompt figure."""
    med = statistics.median
    out = {
        "prompts": len(rows),
        "tokens_per_s": {name: med(row["tokens_per_s"][name] for row in rows) for name in METHODS},
        "speedup_ours": med(row["speedup_ours"] for row in rows),
        "speedup_hf": med(row["speedup_hf"] for row in rows),
        "acceptance_rate": med(row["acceptance_rate"] for row in rows),
        "tokens_per_round": med(row["tokens_per_round"] for row in rows),
        "greedy_equal": {name: all(row["greedy_equal"][name] for row in rows) for name in METHODS},
    }
    out["ours_over_peer"] = out["speedup_ours"] / out["speedup_hf"]
    return out


_HEADER = (
    f"{'prompt':<36} {'ours k=0':>8} {'ours ng':>8} {'hf':>8} {'hf pld':>8} "
    f"{'ours x':>7} {'hf x':>7} {'ours/hf':>7} {'accept':>7} {'tok/rnd':>7} {'equal':>5}"
)


def _line(label: str, row: dict) -> str:
    tps = row["tokens_per_s"]
    equal = all(row["greedy_equal"].values())
    ours_over_peer = row["speedup_ours"] / row["speedup_hf"]
    return (
        f"{label[:36]:<36} {tps['ours_k0']:>8.2f} {tps['ours_ngram']:>8.2f} "
        f"{tps['hf_greedy']:>8.2f} {tps['hf_pld']:>8.2f} "
        f"{row['speedup_ours']:>6.2f}x {row['speedup_hf']:>6.2f}x {ours_over_peer:>7.2f} "
        f"{row['acceptance_rate']:>7.0%} {row['tokens_per_round']:>7.2f} {'yes' if equal else 'NO':>5}"
    )


def print_tables(results: dict, out=None) -> None:
    out = out or sys.stdout  # looked up per call: a captured stdout may have closed since import
    for name, summary in results["workloads"].items():
        print(f"\n== workload {name} (tokens/s, median of {results['config']['repeats']} repeats) ==", file=out)
        print(_HEADER, file=out)
        for row in results["prompts"]:
            if row["workload"] == name:
                print(_line(row["label"], row), file=out)
        print(_line("median", summary), file=out)
    print("\n== overall (median over all prompts) ==", file=out)
    print(_HEADER, file=out)
    print(_line("all", results["overall"]), file=out)
    if not all(results["overall"]["greedy_equal"].values()):
        bad = [
            f"{row['workload']}/{row['label']}: {[m for m, ok in row['greedy_equal'].items() if not ok]}"
            for row in results["prompts"]
            if not all(row["greedy_equal"].values())
        ]
        print("\nGREEDY EQUALITY FAILED (tokens differ from ours_k0): " + "; ".join(bad), file=out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    if argv[:1] == ["--"]:  # the separator a wrapping CLI's REMAINDER passes on (`-- --k 6`)
        argv = argv[1:]
    p = argparse.ArgumentParser(
        prog="python -m specdec.bench.single_process",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flags.add_max_new_tokens(p, 64, "tokens every method generates")
    flags.add_repeats(p, 3, "timed runs per method and prompt; tables show the median")
    flags.add_k(p, DEFAULT_K, "max draft tokens, ours and transformers' prompt_lookup_num_tokens")
    add_workload_flags(p)
    args = p.parse_args(argv)
    require_positive(p, args, ("max_new_tokens", "repeats", "k", "prompts"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = WORKLOADS if args.workload == "all" else (args.workload,)
    prompts = [(name, label, text) for name in names for label, text in workload(name, args.prompts)]

    target, _ = load_pair(args.target_model, "ngram")
    encoded = []
    for name, label, text in prompts:
        ids = target.tokenizer(text)["input_ids"]
        if args.max_prompt_tokens:
            ids = ids[-args.max_prompt_tokens :]
        encoded.append((name, label, ids))

    rows = []
    with asyncio.Runner() as runner:
        methods = make_methods(target, args.k, runner)
        warmup_ids = encoded[0][2]
        for method in methods.values():  # first calls pay for allocator growth and lazy init
            method(warmup_ids, min(args.max_new_tokens, 8))
        order = random.Random(0)  # the method orders are shuffled, but the same every run
        with tqdm(
            total=len(encoded) * args.repeats * len(METHODS), desc="bench", unit="run", file=sys.stderr
        ) as progress:
            for name, label, ids in encoded:
                progress.set_postfix_str(f"{name}/{label}")
                rows.append({"workload": name, "label": label, **bench_prompt(methods, ids, args, order, progress)})
                rows[-1]["text"] = target.tokenizer.decode(rows[-1]["token_ids"])

    results = {
        "config": {
            **vars(args),
            "model": target.name,
            "methods": list(METHODS),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
        "prompts": rows,
        "workloads": {name: summarize([row for row in rows if row["workload"] == name]) for name in names},
        "overall": summarize(rows),
    }
    print_tables(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    # Only our own equality is a failure; a transformers path that differs is reported above.
    return 0 if results["overall"]["greedy_equal"]["ours_ngram"] else 1


if __name__ == "__main__":
    sys.exit(main())
