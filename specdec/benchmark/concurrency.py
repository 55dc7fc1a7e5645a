"""Concurrency: N client streams at once against one stack, speculation off, on and load-aware.

Every level serves the same mixed prompt set: with m prompts, each of N streams runs
max(1, m // N) requests back to back, stream i starting at prompt i, so one stream walks the
whole set and 64 streams cover it several times over. Each request is a GenerateStream call; the
arrival time of each message gives time to first token and time per output token (TPOT: the
time after the first message over the tokens after it), and all messages together give the
aggregate tokens/s and its course over time.

Arms: `off` asks for no speculation (k = 0); `on` speculates with adaptive k whatever the load;
`load_aware` is a coordinator with a speculation token budget (coordinator/engine.py): each
request drafts at most budget // running - 1 tokens, so drafts shrink as streams are added and
stop once the budget is one position per request, and come back as the load drops.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from specdec.v1 import generation_pb2 as pb
from specdec.v1 import generation_pb2_grpc

ARMS = ("off", "on", "load_aware")


@dataclass
class StreamedRequest:
    prompt: int  # index into the prompt set
    started: float  # seconds since the level began
    # Per streamed message: (seconds since the level began, tokens in the message).
    events: list[tuple[float, int]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.events[0][0] - self.started

    @property
    def tpot(self) -> float | None:
        after_first = len(self.token_ids) - self.events[0][1]
        return (self.events[-1][0] - self.events[0][0]) / after_first if after_first > 0 else None


async def _request(
    stub, prompt: int, ids: list[int], max_new_tokens: int, speculate: bool, k: int, t0: float
) -> StreamedRequest:
    request = pb.GenerateRequest(
        prompt_token_ids=ids,
        max_new_tokens=max_new_tokens,
        speculation=pb.SpeculationParams(disabled=not speculate, max_draft_tokens=k),
    )
    out = StreamedRequest(prompt, time.perf_counter() - t0)
    async for message in stub.GenerateStream(request):
        if message.token_ids:
            out.events.append((time.perf_counter() - t0, len(message.token_ids)))
            out.token_ids += message.token_ids
        if message.HasField("speculation"):
            out.draft_tokens, out.accepted_tokens = (
                message.speculation.draft_tokens,
                message.speculation.accepted_tokens,
            )
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_level(stub, speculate: bool, streams: int, prompts: list[list[int]], max_new_tokens: int, k: int) -> dict:
    per_stream = max(1, len(prompts) // streams)
    t0 = time.perf_counter()

    async def stream(i: int) -> list[StreamedRequest]:
        done = []
        for j in range(per_stream):
            p = (i + j) % len(prompts)
            done.append(await _request(stub, p, prompts[p], max_new_tokens, speculate, k, t0))
        return done

    requests = [r for rs in await asyncio.gather(*(stream(i) for i in range(streams))) for r in rs]
    wall = max(r.events[-1][0] for r in requests)
    tokens = sum(len(r.token_ids) for r in requests)
    tpots = [r.tpot for r in requests if r.tpot is not None]
    drafted = sum(r.draft_tokens for r in requests)
    return {
        "streams": streams,
        "requests": len(requests),
        "tokens": tokens,
        "seconds": wall,
        "tokens_per_s": tokens / wall,
        "tpot_ms_p50": 1000 * statistics.median(tpots),
        "tpot_ms_p99": 1000 * _percentile(tpots, 0.99),
        "ttft_ms_p50": 1000 * statistics.median(r.ttft for r in requests),
        "acceptance_rate": sum(r.accepted_tokens for r in requests) / drafted if drafted else 0.0,
        "draft_tokens": drafted,
        "events": sorted(e for r in requests for e in r.events),
        "outputs": [[r.prompt, r.token_ids] for r in requests],
    }


async def measure(
    stubs: dict[str, generation_pb2_grpc.GenerationServiceStub],
    levels: list[int],
    prompts: list[list[int]],
    max_new_tokens: int,
    k: int,
    repeats: int,
    progress: tqdm,
) -> dict:
    """results[arm][level] = the median repeat (by aggregate tokens/s) of that cell, with the
    others' tokens/s kept; the arms of a level run in a fresh seeded order each repeat."""
    arms = {"off": (stubs["on"], False), "on": (stubs["on"], True), "load_aware": (stubs["load_aware"], True)}
    order = random.Random(1)
    cells: dict[str, dict[int, list[dict]]] = {arm: {level: [] for level in levels} for arm in arms}
    for level in levels:
        for _ in range(repeats):
            for arm in order.sample(list(arms), len(arms)):
                progress.set_postfix_str(f"concurrency {level}: {arm}")
                stub, speculate = arms[arm]
                cells[arm][level].append(await run_level(stub, speculate, level, prompts, max_new_tokens, k))
                progress.update()
    results: dict[str, dict[str, dict]] = {}
    for arm, by_level in cells.items():
        results[arm] = {}
        for level, runs in by_level.items():
            ranked = sorted(runs, key=lambda r: r["tokens_per_s"])
            median = dict(ranked[len(ranked) // 2])
            median["tokens_per_s_repeats"] = [r["tokens_per_s"] for r in runs]
            results[arm][str(level)] = median
    return results


def outputs_agree(results: dict) -> bool:
    """Greedy: every request of a prompt produced the same tokens, in every arm and level."""
    seen: dict[int, list[int]] = {}
    for by_level in results.values():
        for cell in by_level.values():
            for prompt, ids in cell["outputs"]:
                if seen.setdefault(prompt, ids) != ids:
                    return False
    return True
