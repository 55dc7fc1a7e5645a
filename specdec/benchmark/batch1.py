"""Batch 1: every method on every prompt, side by side, and what each prompt's runs show.

Within a repeat the methods of a prompt run one after another in a fresh seeded order (a fixed
rotation would give each the same predecessor every time), so a busy neighbour slows them alike;
each figure is the median over repeats. Speedups are ratios of tokens/s measured in this run:
ours over our own target-only decoding through the same stack (k = 0), the peer's over its own
greedy decoding, and ours over the peer's.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from tqdm import tqdm

from specdec.benchmark.ideal import efficiency
from specdec.benchmark.spans import Request, acceptance_by_position, time_split
from specdec.benchmark.stack import Method, Run

BASELINE = "target_only"
OURS = ("ngram", "model", "hybrid")  # speculative methods through the stack
PEER = {"ngram": "hf_pld", "model": "hf_assisted"}  # the peer doing the same kind of drafting (the hybrid has none)


@dataclass
class Prompt:
    workload: str
    label: str
    ids: list[int]


async def measure(
    methods: dict[str, Method], prompts: list[Prompt], repeats: int, max_new_tokens: int, progress: tqdm
) -> list[dict[str, list[Run]]]:
    """runs[p][method]: that method's runs on prompt p, one per repeat."""
    order = random.Random(0)
    names = list(methods)
    for method in methods.values():  # first calls pay for allocator growth, lazy init, connections
        await method(prompts[0].ids, min(max_new_tokens, 8))
    out = []
    for prompt in prompts:
        progress.set_postfix_str(f"batch 1: {prompt.workload}/{prompt.label}"[:60])
        runs: dict[str, list[Run]] = {name: [] for name in names}
        for _ in range(repeats):
            for name in order.sample(names, len(names)):
                runs[name].append(await methods[name](prompt.ids, max_new_tokens))
                progress.update()
        out.append(runs)
    return out


def prompt_row(prompt: Prompt, runs: dict[str, list[Run]], requests: dict[str, Request]) -> dict:
    """Medians, speedups, acceptance, the ideal and the time split of one prompt's runs."""
    med = statistics.median
    reference = runs[BASELINE][0].token_ids
    tps = {name: med(run.tokens_per_s for run in method_runs) for name, method_runs in runs.items()}
    traced = {
        name: [requests[run.trace_id] for run in method_runs if run.trace_id in requests]
        for name, method_runs in runs.items()
    }
    row = {
        "workload": prompt.workload,
        "label": prompt.label,
        "prompt_tokens": len(prompt.ids),
        "new_tokens": len(reference),
        "tokens_per_s": tps,
        "seconds": {name: [run.seconds for run in method_runs] for name, method_runs in runs.items()},
        "greedy_equal": {
            name: all(run.token_ids == reference for run in method_runs) for name, method_runs in runs.items()
        },
        "speedup": {},
        "over_peer": {},
        "acceptance_rate": {},
        "tokens_per_round": {},
        "acceptance_by_position": {},
        "ideal": {},
        "time_split_ms": {name: time_split(reqs) for name, reqs in traced.items() if reqs},
    }
    for peer in ("hf_pld", "hf_assisted"):
        if peer in tps:
            row["speedup"][peer] = tps[peer] / tps["hf_greedy"]
    for name in OURS:
        if name not in runs:
            continue
        row["speedup"][name] = tps[name] / tps[BASELINE]
        if PEER.get(name) in tps:
            row["over_peer"][name] = tps[name] / tps[PEER[name]]
        last = runs[name][-1]
        row["acceptance_rate"][name] = last.accepted_tokens / last.draft_tokens if last.draft_tokens else 0.0
        row["tokens_per_round"][name] = len(last.token_ids) / last.rounds if last.rounds else 0.0
        row["acceptance_by_position"][name] = acceptance_by_position(traced[name])
        if traced[name] and traced[BASELINE]:
            row["ideal"][name] = efficiency(traced[name], traced[BASELINE])
    return row


def summarize(rows: list[dict]) -> dict:
    """Medians over prompts, of each figure separately."""
    med = statistics.median

    def medians(field: str) -> dict[str, float]:
        """The median of rows[*][field][name] for each name some row has."""
        names = dict.fromkeys(name for row in rows for name in row[field])
        return {name: med(row[field][name] for row in rows if name in row[field]) for name in names}

    methods = rows[0]["tokens_per_s"].keys()
    out = {
        "prompts": len(rows),
        "tokens_per_s": medians("tokens_per_s"),
        "speedup": medians("speedup"),
        "over_peer": medians("over_peer"),
        "acceptance_rate": medians("acceptance_rate"),
        "greedy_equal": {m: all(row["greedy_equal"][m] for row in rows) for m in methods},
        "ideal": {},
        "alpha_by_position": {},  # per drafter that drafted at all
        "time_split_ms": {},
    }
    for m in OURS:
        ideals = [row["ideal"][m] for row in rows if m in row["ideal"]]
        if ideals:
            out["ideal"][m] = {
                key: med(i[key] for i in ideals)
                for key in (
                    "ideal_speedup",
                    "measured_decode_speedup",
                    "efficiency",
                    "c",
                    "t1_ms",
                    "verify_ms_median",
                    "mean_k",
                )
            }
        curves = [row["acceptance_by_position"][m] for row in rows if row["acceptance_by_position"].get(m)]
        if curves:  # position i: the median over the prompts that drafted that deep
            out["alpha_by_position"][m] = [
                med(c[i] for c in curves if i < len(c)) for i in range(max(map(len, curves)))
            ]
    for m in methods:
        splits = [row["time_split_ms"][m] for row in rows if m in row["time_split_ms"]]
        if splits:
            out["time_split_ms"][m] = {part: med(s[part] for s in splits) for part in splits[0]}
    return out
