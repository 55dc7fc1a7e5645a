"""Waves of streamed requests against one server, and their summaries: throughput, time to first
token, the gaps between chunks and tokens at p50/p90/p99, and ratios paired by repeat. Shared by
the cold and the repeat workloads of `specdec bench --peer vllm` (serving.py)."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

from specdec.benchmark.servers import Server


@dataclass
class Streamed:
    prompt: int
    started: float
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, tokens)
    token_ids: list[int] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.chunks[0][0] - self.started

    @property
    def gaps(self) -> list[float]:
        times = [t for t, _ in self.chunks]
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def token_gaps(self) -> list[float]:
        """Each token's share of the gap before the chunk that brought it: a chunk of n tokens
        after a gap g counts n gaps of g / n (a speculative round's wait, shared by its tokens)."""
        times = [t for t, _ in self.chunks]
        return [(b - a) / n for a, (b, n) in zip(times, self.chunks[1:]) for _ in range(n)]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first chunk: a speculative chunk's gap is a round's,
        shared by its tokens. None for a request answered in one chunk."""
        after = sum(n for _, n in self.chunks[1:])
        return (self.chunks[-1][0] - self.chunks[0][0]) / after if after else None


async def _stream(http, server: Server, prompt: int, ids: list[int], new_tokens: int, t0: float) -> Streamed:
    body = {
        "model": server.model,
        "prompt": ids,
        "max_tokens": new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
        **server.extra,
    }
    out = Streamed(prompt, time.perf_counter() - t0)
    async with http.stream("POST", server.url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{server.url}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", ()):
                ids_ = choice.get("token_ids") or []
                if ids_:
                    out.chunks.append((time.perf_counter() - t0, len(ids_)))
                    out.token_ids.extend(ids_)
    return out


async def wave(
    server: Server, prompts: list[list[int]], streams: int, new_tokens: int, warmup: list[int] | None = None
) -> tuple[list[Streamed], float]:
    """`streams` clients at once, each running its share of `prompts` back to back, after one
    short request (`warmup`, else the first prompt) that connects and warms the server."""
    import httpx2

    per_stream = max(1, len(prompts) // streams)
    limits = httpx2.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    async with httpx2.AsyncClient(timeout=1800, limits=limits) as http:
        await _stream(http, server, 0, warmup or prompts[0], 2, time.perf_counter())

        async def client(i: int) -> list[Streamed]:
            done = []
            for j in range(per_stream):
                p = (i + j * streams) % len(prompts)
                done.append(await _stream(http, server, p, prompts[p], new_tokens, t0))
            return done

        t0 = time.perf_counter()
        runs = [r for rs in await asyncio.gather(*(client(i) for i in range(streams))) for r in rs]
        return runs, time.perf_counter() - t0


def transformers_wave(model, prompts: list[list[int]], new_tokens: int) -> tuple[list[Streamed], float]:
    """transformers' `generate`, greedy, EOS off, one prompt after another (no stream: one chunk)."""
    import torch

    runs, t0 = [], time.perf_counter()
    for p, ids in enumerate(prompts):
        started = time.perf_counter() - t0
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=0, eos_token_id=None
            )
        run = Streamed(p, started, token_ids=out[0, len(ids) :].tolist())
        run.chunks.append((time.perf_counter() - t0, len(run.token_ids)))
        runs.append(run)
    return runs, time.perf_counter() - t0


# The arms each cell's ratios are taken against: the peer, and our own target pass.
BASES = ("vllm", "specdec_off")


PERCENTILES = (50, 90, 99)


def summarise(runs: list[Streamed], seconds: list[float], tokens: list[int]) -> dict:
    """Throughput (the median over repeats) and latency percentiles over the repeats' requests:
    ttft (time to first token), itl (the gap between chunks), token_gap (each token's share of
    the gap before its chunk) and tpot (a request's time after its first chunk per token after it)."""
    samples = {
        "ttft": [r.ttft for r in runs],
        "itl": [g for r in runs for g in r.gaps],
        "token_gap": [g for r in runs for g in r.token_gaps],
        "tpot": [t for r in runs if (t := r.tpot) is not None],
    }
    out = {"tokens_per_s": statistics.median(t / s for t, s in zip(tokens, seconds))}
    for name, values in samples.items():
        values.sort()
        for q in PERCENTILES:
            out[f"{name}_p{q}_ms"] = 1000 * _pct(values, q) if values else None
    chunks = sum(len(r.chunks) for r in runs)
    out["tokens_per_chunk"] = sum(len(r.token_ids) for r in runs) / chunks if chunks else None
    out["repeats"] = len(seconds)
    out["tokens_per_s_repeats"] = [t / s for t, s in zip(tokens, seconds)]
    return out


def paired_ratios(by_arm: dict[str, dict]) -> None:
    """Each arm's tokens/s over each base's (`BASES`) as the median of per-repeat ratios: every arm
    runs once per repeat at a cell, so repeat i of two arms ran minutes apart at most, and a busy
    neighbour slowing one repeat slows both sides of its ratio (a ratio of medians mixes repeats)."""
    for arm, cell in by_arm.items():
        ratios = {
            base: [a / b for a, b in zip(cell["tokens_per_s_repeats"], by_arm[base]["tokens_per_s_repeats"])]
            for base in BASES
            if base in by_arm and base != arm
        }
        cell["x"] = {base: statistics.median(r) for base, r in ratios.items()}
        # The first repeat alone: at a set's first level, the default drafter's figure with the
        # least help from completions served before (`report`).
        cell["x_first"] = {base: r[0] for base, r in ratios.items()}


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]
