"""Draft tier over gRPC: Propose round-trip overhead, and draft throughput batched vs one at a time.

  python -m specdec.bench.draft_rpc [--repeats 5] [--sessions 1,8,32] ...

Servers run as real `python -m specdec.draft_service` subprocesses on 127.0.0.1 (as in
production, the coordinator is another process); the client side runs here.

Overhead: the same Propose (same session, same context, so the drafter does the same work each
time) timed three ways: `DraftCore.propose` called in this process (the server's own work: the
drafter plus validation and session bookkeeping), the raw gRPC stub, and `DraftClient` (request
building, incremental context, q unpacking). Overhead = median RPC - median in-process: what the
network hop, serialization and grpc.aio cost on top of the work. Rows: the n-gram drafter, and a
tiny random llama (hidden 64, 2 layers) greedy and sampled; the "262k vocab" rows give the same
tiny model Gemma 3's vocabulary, so q is a realistic size on the wire (dense fp32 1 MiB per draft
token, or sparse under top-k).

Throughput: N sessions propose concurrently, each for --rounds rounds of k = --k; every round
commits the k drafts plus one token, as a fully accepted round would. Draft tokens per second over
the whole run (and Propose calls per second: prompt lookup on random ids often finds fewer than k),
for the model server with --max-batch 32 (continuous batching) and --max-batch 1 (one call per
model step), and for the n-gram server; runs interleaved across the three servers, medians over
--repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.benchmark import flags
from specdec.benchmark.tiny_llama import make_tiny_llama
from specdec.coordinator.clients import DraftClient
from specdec.core.sampling import SamplingParams
from specdec.draft_service.registry import draft_model
from specdec.draft_service.service import DraftConfig, DraftCore, ProposeCall
from specdec.drafts.loading import load_model
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

GEMMA_VOCAB = 262_144
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=1.0, seed=1)
SAMPLED_TOPK = SamplingParams(temperature=1.0, top_k=50, seed=1)


@asynccontextmanager
async def draft_server(model: str, max_batch: int = 32):
    """`python -m specdec.draft_service` on a free port; yields its address once health says SERVING."""
    argv = [
        sys.executable,
        "-m",
        "specdec.draft_service",
        "--draft-model",
        model,
        "--port",
        "0",
        "--max-batch",
        str(max_batch),
        "--max-queue",
        "4096",
    ]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1")
        )
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
            if "listening on" not in line:
                log.seek(0)
                raise RuntimeError(f"draft server did not start: {line!r}\n{log.read()}")
            address = line.rsplit(" ", 1)[-1].strip()
            async with grpc.aio.insecure_channel(address) as channel, asyncio.timeout(120):
                health = health_pb2_grpc.HealthStub(channel)
                while (
                    await health.Check(health_pb2.HealthCheckRequest())
                ).status != health_pb2.HealthCheckResponse.SERVING:
                    await asyncio.sleep(0.05)  # the model loads after the port opens
            yield address
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _context(seed: int, length: int, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


async def _time_calls(fn, calls: int) -> float:
    """Median seconds of one awaited call, after a few warm-up calls."""
    for _ in range(5):
        await fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def overhead_row(name: str, model: str, sampling: SamplingParams, args) -> dict:
    """One row of the overhead table: medians over `args.repeats` of per-call medians."""
    k, calls = args.k, args.calls
    spec = draft_model(model)
    loaded = None if spec is None else load_model(spec)
    context = _context(0, args.context)
    if loaded is None:
        context = (context[: args.context // 2] * 2)[: args.context]  # something for prompt lookup to find
    wire = common_pb2.SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k)
    if sampling.seed is not None:
        wire.seed = sampling.seed
    # The same session and context every time: the drafter re-feeds the last token and drafts k.
    first = draft_pb2.ProposeRequest(session_id="s", new_tokens=context, num_draft_tokens=k, sampling=wire)
    again = draft_pb2.ProposeRequest(session_id="s", committed_len=len(context), num_draft_tokens=k, sampling=wire)
    core = DraftCore(loaded, DraftConfig())
    await core.propose(ProposeCall("s", 0, context, k, sampling))
    repeat = ProposeCall("s", len(context), [], k, sampling)
    samples: dict[str, list[float]] = {"in-process us": [], "stub us": [], "client us": []}
    async with draft_server(model) as address:
        async with grpc.aio.insecure_channel(
            address, options=(("grpc.max_receive_message_length", 256 << 20),)
        ) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            await stub.Propose(first)
            size = (await stub.Propose(again)).ByteSize()
            async with DraftClient(address) as client:
                for _ in range(args.repeats):  # interleaved, so drift on the machine hits all three alike
                    samples["in-process us"].append(await _time_calls(lambda: core.propose(repeat), calls))
                    samples["stub us"].append(await _time_calls(lambda: stub.Propose(again), calls))
                    samples["client us"].append(
                        await _time_calls(lambda: client.propose("c", context, k, sampling), calls)
                    )
    await core.close()
    row = {"case": name, "response bytes": size} | {key: statistics.median(v) * 1e6 for key, v in samples.items()}
    row["overhead stub us"] = row["stub us"] - row["in-process us"]
    row["overhead client us"] = row["client us"] - row["in-process us"]
    return row


async def _session(client: DraftClient, index: int, rounds: int, k: int, prompt_len: int) -> int:
    tokens = _context(index, prompt_len)
    drafted = 0
    for _ in range(rounds):
        proposal = await client.propose(f"session-{index}", tokens, k, GREEDY)
        drafted += len(proposal.token_ids)
        tokens = tokens + proposal.token_ids + [(tokens[-1] + 1) % 256]  # all accepted, plus a bonus
    return drafted


async def throughput(
    client: DraftClient, sessions: int, rounds: int, k: int, prompt_len: int, tag: int
) -> tuple[float, float]:
    """(draft tokens/s, Propose calls/s) with `sessions` sessions proposing concurrently."""
    start = time.perf_counter()
    drafted = await asyncio.gather(*(_session(client, tag * 1000 + i, rounds, k, prompt_len) for i in range(sessions)))
    seconds = time.perf_counter() - start
    return sum(drafted) / seconds, sessions * rounds / seconds


async def transport_floor(address: str, calls: int) -> float:
    """Median seconds of a health Check: a unary grpc.aio call that does no work."""
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        return await _time_calls(lambda: health.Check(health_pb2.HealthCheckRequest()), calls)


def _table(rows: list[dict], columns: list[str], formats: dict[str, str]) -> str:
    cells = [[formats.get(c, "{}").format(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(v.rjust(w) for v, w in zip(row, widths)) + " |" for row in cells]
    return "\n".join(lines)


async def run(args) -> None:
    root = Path(tempfile.mkdtemp(prefix="draft-rpc-bench-"))
    tiny = str(make_tiny_llama(root / "tiny", seed=2))
    big_vocab = str(make_tiny_llama(root / "tiny-262k", seed=2, vocab_size=GEMMA_VOCAB))

    cases = [
        ("ngram, greedy", "ngram", GREEDY),
        ("tiny llama, greedy", tiny, GREEDY),
        ("tiny llama, sampled (q 259 wide)", tiny, SAMPLED),
        ("262k vocab, sampled, dense q", big_vocab, SAMPLED),
        ("262k vocab, sampled top-k 50, sparse q", big_vocab, SAMPLED_TOPK),
    ]
    rows = []
    for name, model, sampling in cases:
        rows.append(await overhead_row(name, model, sampling, args))
        print(f"  measured: {name}", file=sys.stderr)
    print(
        f"\nPropose round trip on loopback, k={args.k}, context {args.context} tokens; "
        f"medians of {args.calls} calls, median over {args.repeats} repeats (microseconds)\n"
    )
    columns = [
        "case",
        "response bytes",
        "in-process us",
        "stub us",
        "client us",
        "overhead stub us",
        "overhead client us",
    ]
    print(_table(rows, columns, {c: "{:.0f}" for c in columns[1:]}))
    await run_throughput(args, tiny)


async def run_throughput(args, tiny: str) -> None:
    """Draft tokens/s of a batched and a one-at-a-time model server and the n-gram server."""
    servers = [
        ("model, batched (max-batch 32)", tiny, 32),
        ("model, one at a time (max-batch 1)", tiny, 1),
        ("ngram", "ngram", 32),
    ]
    tokens: dict[tuple[str, int], list[float]] = {(name, n): [] for name, _, _ in servers for n in args.sessions}
    calls: dict[tuple[str, int], list[float]] = {key: [] for key in tokens}
    async with draft_server(tiny, 32) as batched, draft_server(tiny, 1) as single, draft_server("ngram") as ngram:
        floor = await transport_floor(ngram, args.calls)
        clients = [DraftClient(address) for address in (batched, single, ngram)]
        for client in clients:  # warm-up: connections, first forwards, the batch shapes
            await throughput(client, max(args.sessions), 2, args.k, args.context, 999)
        tag = 0
        for _ in range(args.repeats):  # interleaved, so drift on the machine hits every server alike
            for n in args.sessions:
                for (name, _, _), client in zip(servers, clients):
                    tag += 1  # fresh sessions every run
                    tok_s, call_s = await throughput(client, n, args.rounds, args.k, args.context, tag)
                    tokens[(name, n)].append(tok_s)
                    calls[(name, n)].append(call_s)
        for client in clients:
            await client.close()
    print(f"\ngrpc.aio floor: a health Check (no work) takes {floor * 1e6:.0f} us round trip here")
    print(
        f"\nDraft throughput: draft tokens/s (Propose calls/s); k={args.k}, {args.rounds} rounds per session, "
        f"prompt {args.context} tokens; median over {args.repeats} repeats\n"
    )
    rows = []
    for name, _, _ in servers:
        row = {"server": name}
        for n in args.sessions:
            row[f"{n} sessions"] = (
                f"{statistics.median(tokens[(name, n)]):.0f} ({statistics.median(calls[(name, n)]):.0f})"
            )
        rows.append(row)
    print(_table(rows, ["server"] + [f"{n} sessions" for n in args.sessions], {}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.draft_rpc", description=__doc__.split("\n")[0])
    flags.add_repeats(p, 3)
    p.add_argument("--calls", type=int, default=200, help="timed calls per overhead measurement")
    p.add_argument("--sessions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=16, help="rounds per session in the throughput runs")
    flags.add_k(p, 4)
    p.add_argument("--context", type=int, default=128, help="prompt tokens (the tiny models hold 256 positions)")
    args = p.parse_args(argv)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
