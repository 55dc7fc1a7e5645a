"""Tracing overhead: batch-1 tokens/s through the local stack with tracing on (every request
sampled, every part writing its spans) vs off, side by side in one run.

One local stack (draft server subprocess, target actor on a local Ray, both writing their spans
to a trace file as `specdec up` does) behind two coordinators that differ only in their tracer:
  traced    this process's SDK tracer provider, always sampling, spans to the trace file
  untraced  a provider that samples nothing
The draft server and the actor sample by their parent (the SDK default), so an untraced request
records no span in any process: the two arms differ exactly by tracing. Prometheus metrics are
on in both. Runs alternate in a fresh seeded order each repeat; the table shows medians.

  python -m specdec.bench.tracing [flags]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from tqdm import tqdm

from specdec.bench.flags import add_workload_flags
from specdec.bench.stack import POOL
from specdec.benchmark import flags
from specdec.benchmark.prompts import WORKLOADS, workload
from specdec.benchmark.stack import coordinators, stack_method
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.server import ServerConfig
from specdec.local.stack import LocalStack, StackConfig
from specdec.runtime.loading import load_tokenizer
from specdec.telemetry.trace_file import JsonLinesSpanExporter, read_spans

ARMS = ("traced", "untraced")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.tracing", description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", default="ngram", help="the draft server's model (default ngram)")
    add_workload_flags(p)
    flags.add_max_new_tokens(p, 64)
    flags.add_repeats(p, 5)
    flags.add_k(p, 8)
    args = p.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "repeats", "k"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


async def run(args: argparse.Namespace, trace_file: Path, install_global: bool = True) -> dict:
    names = WORKLOADS if args.workload == "all" else (args.workload,)
    tokenizer = load_tokenizer(args.target_model)
    prompts = []
    for name in names:
        for label, text in workload(name, args.prompts):
            ids = tokenizer(text)["input_ids"]
            prompts.append((f"{name}/{label}", ids[-args.max_prompt_tokens :] if args.max_prompt_tokens else ids))

    # What configure_tracing installs, with the sampler pinned: always on, whatever OTEL_* says.
    traced = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create({SERVICE_NAME: "specdec-coordinator"}))
    traced.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(trace_file), schedule_delay_millis=500))
    if install_global:  # the draft client's gRPC interceptor records its spans with the global one
        trace.set_tracer_provider(traced)
    tracers = {"traced": traced.get_tracer("bench"), "untraced": TracerProvider(sampler=ALWAYS_OFF).get_tracer("bench")}
    config = EngineConfig(
        default_draft_tokens=args.k, max_draft_tokens=max(args.k, 16), adaptive=False
    )  # the same k in both arms
    stack_config = StackConfig(
        target_model=args.target_model,
        draft_model=args.drafter,
        pool_name=POOL,
        trace_file=str(trace_file),
        metrics_port=0,
        server=ServerConfig(port=0),
        engine=config,
    )
    async with LocalStack(stack_config) as stack:
        async with coordinators(stack, args.target_model, {arm: (config, tracers[arm]) for arm in ARMS}) as stubs:
            methods = {arm: stack_method(stubs[arm], True, args.k) for arm in ARMS}
            seconds, tokens = await _measure(args, methods, prompts)
    traced.force_flush()
    await asyncio.sleep(1.5)  # the draft server and the actor flush every 0.5 s
    return _results(args, prompts, seconds, tokens, list(read_spans(trace_file)))


async def _measure(args: argparse.Namespace, methods: dict, prompts: list) -> tuple[dict, dict]:
    """Each prompt --repeats times through both arms in a seeded order: (seconds per run, tokens)."""
    seconds: dict[str, dict[str, list[float]]] = {label: {arm: [] for arm in ARMS} for label, _ in prompts}
    tokens: dict[str, int] = {}
    for arm in ARMS:  # warm-up
        await methods[arm](prompts[0][1], min(8, args.max_new_tokens))
    order = random.Random(0)
    total = len(prompts) * args.repeats * len(ARMS)
    with tqdm(total=total, desc="bench tracing", unit="run", file=sys.stderr) as progress:
        for label, ids in prompts:
            for _ in range(args.repeats):
                for arm in order.sample(ARMS, len(ARMS)):
                    result = await methods[arm](ids, args.max_new_tokens)
                    seconds[label][arm].append(result.seconds)
                    tokens[label] = len(result.token_ids)
                    progress.update()
    return seconds, tokens


def _results(args: argparse.Namespace, prompts: list, seconds: dict, tokens: dict, spans: list[dict]) -> dict:
    rows = []
    for label, _ in prompts:
        tps = {arm: statistics.median(tokens[label] / s for s in seconds[label][arm]) for arm in ARMS}
        rows.append(
            {
                "prompt": label,
                "tokens_per_s": tps,
                "seconds": seconds[label],
                "traced_over_untraced": tps["traced"] / tps["untraced"],
            }
        )
    return {
        "config": {**vars(args)},
        "prompts": rows,
        "median_ratio": statistics.median(row["traced_over_untraced"] for row in rows),
        "spans_by_service": {
            service: sum(1 for s in spans if s["service"] == service)
            for service in sorted({s["service"] for s in spans})
        },
    }


def main(argv: list[str] | None = None, install_global: bool = True) -> int:
    """`install_global` False leaves the process's tracer provider alone (tests: it is set once
    per process); the draft client's own spans are then not recorded, the rest is."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as scratch:
        results = asyncio.run(run(args, Path(scratch) / "traces.jsonl", install_global))
    print(f"\n{'prompt':<40} {'traced':>8} {'untraced':>9} {'ratio':>6}   (tokens/s, median of {args.repeats})")
    for row in results["prompts"]:
        t = row["tokens_per_s"]
        print(f"{row['prompt'][:40]:<40} {t['traced']:>8.2f} {t['untraced']:>9.2f} {row['traced_over_untraced']:>6.3f}")
    print(f"{'median':<40} {'':>8} {'':>9} {results['median_ratio']:>6.3f}")
    print("spans written: " + ", ".join(f"{k} {v}" for k, v in results["spans_by_service"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
