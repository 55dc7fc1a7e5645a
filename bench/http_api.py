"""What the OpenAI-compatible HTTP API costs next to gRPC: the same requests through both APIs of
one coordinator, side by side in one run, at one stream and at 16.

Two parts, each with both APIs on the same engine (the same coordinator process and port pair):
  transport  an engine that generates nothing (it echoes max_tokens tokens at once): the cost of
             the API itself per request, which a model's time would hide in the noise
  stack      the local stack on the embedded model (n-gram drafts, EOS off so every call makes
             exactly --max-new-tokens tokens): what a client sees in tokens/s
  capacity   the transport part's engine, unary requests a second with the leanest clients (grpc's
             C core; a keep-alive socket writing a fixed HTTP request): the server's own time
Modes: `unary` (Generate / a completions response) and `stream` (GenerateStream / server-sent
events). The clients run in a process of their own (grpc.aio, and httpx2, the `openai` SDK's
transport), so their CPU is not the server's; arms alternate in a fresh seeded order each repeat.
Per mode and concurrency: the median latency per request of each API; the median time outside
the engine (the client's wait less the engine's own `generation_seconds`), whose HTTP - gRPC
difference is the API's cost per request, free of the model's noise; and tokens/s (all the
wave's tokens over its wall clock) with the HTTP / gRPC ratio. The stack part runs a fixed k, so
both APIs' requests do the same rounds.

  python -m specdec.bench.http_api [--repeats 5] [--prompts 2] [--skip-stack] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import platform
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from specdec.benchmark import flags

ARMS = ("grpc", "http")
MODES = ("unary", "stream")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.http_api", description=__doc__.split("\n\n")[0])
    flags.add_target_model(p)
    flags.add_prompts(p, 2, "free-text prompts")
    flags.add_max_new_tokens(p, 32)
    flags.add_repeats(p, 5, "waves per arm, mode and concurrency")
    p.add_argument("--concurrency", type=int, action="append", help="streams at once (repeatable; default 1 and 16)")
    p.add_argument("--transport-requests", type=int, default=50, help="requests per wave in the transport part")
    p.add_argument("--skip-stack", action="store_true", help="the transport part only (no model)")
    flags.add_json(p)
    args = p.parse_args(argv)
    args.concurrency = args.concurrency or [1, 16]
    for name in ("prompts", "max_new_tokens", "repeats", "transport_requests"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.concurrency) < 1:
        p.error("--concurrency must be >= 1")
    return args


class EchoEngine:
    """An engine with no model: `max_new_tokens` tokens, one a delta, at once (the transport part)."""

    def __init__(self):
        self.target = type("Target", (), {"name": "echo", "max_context": 1 << 20})()

    async def stream(self, request):
        from specdec.coordinator.engine import Delta, FinishReason, SpeculationStats

        n = request.max_new_tokens
        for i in range(n):
            last = i == n - 1
            yield Delta(
                [7], "x", FinishReason.LENGTH if last else None, 4 if last else 0, SpeculationStats() if last else None
            )


# --- the client process --------------------------------------------------------------------------------


def client_wave(arm: str, mode: str, grpc_address: str, http_url: str, prompts: list, max_new_tokens: int, c: int):
    """One wave, in the client process: for each prompt, `c` identical requests at once. Returns
    (per-request seconds, wave seconds, tokens); a request first warms the connection."""
    return asyncio.run(_wave(arm, mode, grpc_address, http_url, prompts, max_new_tokens, c))


async def _wave(arm, mode, grpc_address, http_url, prompts, max_new_tokens, c):
    import grpc
    import httpx2

    from specdec.v1 import generation_pb2 as pb
    from specdec.v1 import generation_pb2_grpc

    requests: list[tuple[float, float]] = []  # (seconds the client waited, seconds the engine generated)
    tokens = 0
    async with grpc.aio.insecure_channel(grpc_address) as channel, httpx2.AsyncClient(timeout=600) as http:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)

        async def one(ids: list[int]) -> int:
            started = time.perf_counter()
            if arm == "grpc":
                request = pb.GenerateRequest(prompt_token_ids=ids, max_new_tokens=max_new_tokens)
                if mode == "unary":
                    last = await stub.Generate(request)
                else:
                    stream = stub.GenerateStream(pb.GenerateStreamRequest.FromString(request.SerializeToString()))
                    async for message in stream:
                        last = message
                n, generation_s = last.usage.completion_tokens, last.speculation.generation_seconds
            else:
                body = {"prompt": ids, "max_tokens": max_new_tokens, "temperature": 0}
                if mode == "unary":
                    final = (await http.post(http_url + "/v1/completions", json=body)).json()
                    n = final["usage"]["completion_tokens"]
                else:
                    body.update(stream=True, stream_options={"include_usage": True})
                    final, n = {}, 0
                    async with http.stream("POST", http_url + "/v1/completions", json=body) as response:
                        async for line in response.aiter_lines():
                            if line.startswith("data: {"):
                                chunk = json.loads(line[6:])
                                final = chunk if "speculation" in chunk else final
                                n = chunk["usage"]["completion_tokens"] if chunk.get("usage") else n
                generation_s = final["speculation"]["generation_seconds"]
            requests.append((time.perf_counter() - started, generation_s))
            return n

        await one(prompts[0])  # connect and warm up, untimed
        requests.clear()
        wave_started = time.perf_counter()
        for ids in prompts:
            tokens += sum(await asyncio.gather(*(one(ids) for _ in range(c))))
        return requests, time.perf_counter() - wave_started, tokens


def client_capacity(arm: str, grpc_address: str, http_port: int, max_new_tokens: int, c: int, n: int) -> float:
    """Unary requests a second that the server answers to `c` clients each sending `n` in turn, the
    clients as lean as each protocol allows: grpc's C core, and for HTTP a keep-alive socket that
    writes a fixed request and reads Content-Length bytes (a measuring client, not a server)."""
    return asyncio.run(_capacity(arm, grpc_address, http_port, max_new_tokens, c, n))


async def _capacity(arm, grpc_address, http_port, max_new_tokens, c, n) -> float:
    import grpc

    from specdec.v1 import generation_pb2 as pb
    from specdec.v1 import generation_pb2_grpc

    if arm == "grpc":
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            request = pb.GenerateRequest(prompt_token_ids=[5, 6, 7, 8], max_new_tokens=max_new_tokens)

            async def client(count: int) -> None:
                for _ in range(count):
                    await stub.Generate(request)

            await client(1)
            started = time.perf_counter()
            await asyncio.gather(*(client(n) for _ in range(c)))
            return n * c / (time.perf_counter() - started)
    body = json.dumps({"prompt": [5, 6, 7, 8], "max_tokens": max_new_tokens, "temperature": 0}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    )
    request = head.encode() + b"\r\n\r\n" + body

    async def http_client(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
        for _ in range(count):
            writer.write(request)
            await writer.drain()
            lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
            length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
        writer.close()

    await http_client(1)
    started = time.perf_counter()
    await asyncio.gather(*(http_client(n) for _ in range(c)))
    return n * c / (time.perf_counter() - started)


async def capacity(server, args, pool) -> list[dict]:
    """The server's own cost per unary request, both APIs, with lean clients: requests a second."""
    loop = asyncio.get_running_loop()
    order = random.Random(1)
    rows = []
    for c in args.concurrency:
        per_second: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.repeats):
            for arm in order.sample(ARMS, len(ARMS)):
                per_second[arm].append(
                    await loop.run_in_executor(
                        pool,
                        client_capacity,
                        arm,
                        f"127.0.0.1:{server.port}",
                        server.http_port,
                        args.max_new_tokens,
                        c,
                        args.transport_requests,
                    )  # fmt: skip
                )
        row = {"part": "capacity", "mode": "unary", "concurrency": c}
        for arm in ARMS:
            row[f"{arm}_requests_per_s"] = statistics.median(per_second[arm])
        row["http_extra_ms"] = 1000 * (1 / row["http_requests_per_s"] - 1 / row["grpc_requests_per_s"])
        rows.append(row)
        print(_line(row), file=sys.stderr, flush=True)
    return rows


# --- the server process --------------------------------------------------------------------------------


async def measure(server, prompts: list, max_new_tokens: int, args, part: str, pool) -> list[dict]:
    grpc_address, http_url = f"127.0.0.1:{server.port}", f"http://127.0.0.1:{server.http_port}"
    loop = asyncio.get_running_loop()
    order = random.Random(0)
    rows = []
    for mode in MODES:
        for c in args.concurrency:
            runs: dict[str, list] = {arm: [] for arm in ARMS}
            for _ in range(args.repeats):
                for arm in order.sample(ARMS, len(ARMS)):
                    wave = await loop.run_in_executor(
                        pool, client_wave, arm, mode, grpc_address, http_url, prompts, max_new_tokens, c
                    )
                    runs[arm].append(wave)
            row = {"part": part, "mode": mode, "concurrency": c}
            for arm in ARMS:
                requests = [r for waited, _, _ in runs[arm] for r in waited]
                row[f"{arm}_latency_ms"] = 1000 * statistics.median(w for w, _ in requests)
                # The client's wait less the engine's own generation time: the API's share.
                row[f"{arm}_outside_engine_ms"] = 1000 * statistics.median(w - g for w, g in requests)
                row[f"{arm}_tokens_per_s"] = statistics.median(n / wall for _, wall, n in runs[arm])
                row[f"{arm}_waves"] = [{"seconds": wall, "tokens": n} for _, wall, n in runs[arm]]
            row["http_extra_ms"] = row["http_outside_engine_ms"] - row["grpc_outside_engine_ms"]
            row["http_over_grpc_tokens_per_s"] = row["http_tokens_per_s"] / row["grpc_tokens_per_s"]
            # What the extra time per request costs in tokens/s, at the median request's length.
            row["http_tokens_per_s_cost_bound"] = row["http_extra_ms"] / row["grpc_latency_ms"]
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)
    return rows


def _line(row: dict) -> str:
    if row["part"] == "capacity":
        return (
            f"capacity  unary  c={row['concurrency']:<3} requests/s grpc {row['grpc_requests_per_s']:8.1f} "
            f"http {row['http_requests_per_s']:8.1f}: the server's time per request HTTP - gRPC "
            f"{row['http_extra_ms']:+.3f} ms"
        )
    return (
        f"{row['part']:<9} {row['mode']:<6} c={row['concurrency']:<3} latency ms grpc {row['grpc_latency_ms']:8.2f} "
        f"http {row['http_latency_ms']:8.2f} | outside the engine ms grpc {row['grpc_outside_engine_ms']:6.2f} "
        f"http {row['http_outside_engine_ms']:6.2f} ({row['http_extra_ms']:+.2f}) | tokens/s grpc "
        f"{row['grpc_tokens_per_s']:8.1f} http {row['http_tokens_per_s']:8.1f} "
        f"(x{row['http_over_grpc_tokens_per_s']:.3f}; the extra time alone: {row['http_tokens_per_s_cost_bound']:.2%})"
    )


async def run(args: argparse.Namespace) -> dict:
    from specdec.coordinator.server import GenerationServer, ServerConfig

    rows = []
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        server = GenerationServer(EchoEngine(), ServerConfig(port=0, http_port=0, max_inflight=256))
        await server.start()
        try:
            echo_prompts = [[5, 6, 7, 8]] * args.transport_requests
            rows += await measure(server, echo_prompts, args.max_new_tokens, args, "transport", pool)
            rows += await capacity(server, args, pool)
        finally:
            await server.stop(0)
        if not args.skip_stack:
            rows += await _stack_part(args, pool)
    finally:
        pool.shutdown()
    return {"config": vars(args), "rows": rows}


async def _stack_part(args: argparse.Namespace, pool) -> list[dict]:
    from specdec.benchmark.prompts import workload
    from specdec.coordinator.engine import EngineConfig, SpeculativeEngine
    from specdec.coordinator.remote import connect_engine
    from specdec.coordinator.server import GenerationServer, ServerConfig
    from specdec.local.stack import LocalStack, StackConfig
    from specdec.runtime.loading import load_tokenizer
    from specdec.target_service.pool import PoolConfig, TargetPool

    tokenizer = load_tokenizer(args.target_model)
    prompts = [tokenizer(text)["input_ids"] for _, text in workload("free", args.prompts)]
    config = StackConfig(
        target_model=args.target_model, draft_model="ngram", pool_name="specdec-bench-http", metrics_port=0
    )
    async with LocalStack(config) as stack:
        target_pool = TargetPool(PoolConfig(prefix=config.pool_name, namespace=config.namespace))
        # Fixed k: both APIs' requests do the same rounds, so what differs is the API.
        engine = await connect_engine(stack.draft, target_pool, args.target_model, EngineConfig(adaptive=False))
        # EOS off: every call generates exactly max_new_tokens, in both APIs.
        target = replace(engine.target, eos_token_ids=frozenset())
        engine = SpeculativeEngine(engine.proposer, engine.verifier, target, engine.config)
        server = GenerationServer(engine, ServerConfig(port=0, http_port=0, max_inflight=256))
        await server.start()
        try:
            return await measure(server, prompts, args.max_new_tokens, args, "stack", pool)
        finally:
            await server.stop(0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = asyncio.run(run(args))
    results["machine"] = {"platform": platform.platform(), "python": platform.python_version()}
    results["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    print()
    for row in results["rows"]:
        print(_line(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
