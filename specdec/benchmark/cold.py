"""The cold workload of `specdec bench --peer vllm`: prompts no server has seen.

A user's traffic is mostly new prompts, and a cache of earlier completions (our suffix drafter's
global tree, a peer's prefix cache) answers a prompt it saw before from memory: a benchmark that
sends its prompts again measures that memory. Here every prompt of the cold set
(cold_prompts.py, rendered through the model's chat template) is sent once in a server's
life: each repeat starts a fresh server for every arm (ours with speculation off, ours with its
default drafter, the peer's), and the concurrency levels of a repeat take disjoint prompts
(`assign`). What the suffix tree learns from the other new prompts of its life it may use: that
is what a server meets in production.

The arms of a repeat run one after another in a seeded order, each on its own fresh server, the
levels in ascending order; every output is compared token for token with the first output of
its prompt (transformers' greedy, at one stream, is one of them).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from specdec.benchmark import waves
from specdec.benchmark.servers import Server

SET = "cold"
WARMUP_TEXT = "Say hello."  # each wave's first request (2 tokens): connects and warms, not measured


def render(tokenizer, messages: tuple[tuple[str, str], ...], max_tokens: int = 0) -> list[int]:
    """A conversation's prompt ids through the tokenizer's chat template, with the turn that
    asks the model to answer; a tokenizer without one gets `role: text` lines. `max_tokens`
    keeps the last ones (0: all; for tiny test models)."""
    turns = [{"role": role, "content": text} for role, text in messages]
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    else:
        text = "".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant:"
        ids = tokenizer(text)["input_ids"]
    return ids[-max_tokens:] if max_tokens else ids


def pool(tokenizer, max_tokens: int = 0) -> list[list[int]]:
    from specdec.benchmark import cold_prompts

    return [render(tokenizer, messages, max_tokens) for _, messages in cold_prompts.conversations()]


def per_repeat(levels: list[int], serial: int) -> dict[int, int]:
    """Prompts a repeat sends at each level: `serial` one after another at one stream, one per
    stream at N streams (N requests at once)."""
    return {level: serial if level == 1 else level for level in levels}


def assign(size: int, levels: list[int], serial: int, repeats: int, seed: int = 0) -> list[dict[int, list[int]]]:
    """Each repeat's prompts (indexes into the pool) by level, disjoint within a repeat: repeats
    take consecutive runs of one seeded order of the pool, wrapping round it when it is used up
    (a fresh server per repeat has seen none of them)."""
    need = per_repeat(levels, serial)
    total = sum(need.values())
    if total > size:
        raise ValueError(f"a repeat sends {total} cold prompts, the set has {size}")
    order = list(range(size))
    random.Random(seed).shuffle(order)
    plan, start = [], 0
    for _ in range(repeats):
        by_level = {}
        for level in levels:
            by_level[level] = [order[(start + j) % size] for j in range(need[level])]
            start += need[level]
        plan.append(by_level)
    return plan


Launch = Callable[[str], Awaitable[tuple[Server, Callable[[], None]]]]  # arm -> a fresh server, its stop


async def measure(
    launch: Launch,
    arms: list[str],
    hf_model,
    prompts: list[list[int]],
    plan: list[dict[int, list[int]]],
    new_tokens: int,
    warmup: list[int],
    seed: int = 0,
    progress=None,
) -> dict:
    """Every arm at every level of every repeat of `plan`, each arm of a repeat on a fresh server.
    Returns {"table": {"cold": {level: {arm: summary}}}, "mismatches": [...]}."""
    rng = random.Random(seed)
    raw: dict[int, dict[str, tuple[list, list, list]]] = {}
    reference: dict[int, list[int]] = {}
    mismatches: list[dict] = []

    def record(arm: str, level: int, runs: list[waves.Streamed], seconds: float, ids: list[int]) -> None:
        cell = raw.setdefault(level, {}).setdefault(arm, ([], [], []))
        cell[0].extend(runs)
        cell[1].append(seconds)
        cell[2].append(sum(len(r.token_ids) for r in runs))
        for r in runs:
            r.prompt = ids[r.prompt]  # the wave's index -> the pool's
            if r.token_ids != reference.setdefault(r.prompt, r.token_ids):
                mismatches.append({"arm": arm, "set": SET, "prompt": r.prompt, "level": level})
        if progress is not None:
            progress.update(1)

    for by_level in plan:
        order = list(arms)
        rng.shuffle(order)
        for arm in order:
            server, stop = await launch(arm)
            try:
                for level, ids in by_level.items():
                    runs, seconds = await waves.wave(server, [prompts[i] for i in ids], level, new_tokens, warmup)
                    record(arm, level, runs, seconds, ids)
            finally:
                stop()
        if hf_model is not None and 1 in by_level:
            ids = by_level[1]
            wave = [prompts[i] for i in ids]
            runs, seconds = await asyncio.to_thread(waves.transformers_wave, hf_model, wave, new_tokens)
            record("transformers", 1, runs, seconds, ids)
    table = {level: {arm: waves.summarise(*cell) for arm, cell in by_arm.items()} for level, by_arm in raw.items()}
    for by_arm in table.values():
        waves.paired_ratios(by_arm)
    return {"table": {SET: table}, "mismatches": mismatches}
