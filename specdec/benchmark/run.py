"""`specdec bench` (`python -m specdec.bench`): does speculation pay off for this pair on this machine?

One run, on the same models and prompts, side by side:
  1. target-only decoding through the local stack (k = 0): the baseline;
  2. speculation at batch 1 through the same stack: the n-gram drafter, a model drafter
     (--model-drafter) and the hybrid of both (prompt lookup where the context repeats, the model
     elsewhere), adaptive k at most --k;
  3. the peer, transformers' own generate in this process: greedy, prompt lookup
     (prompt_lookup_num_tokens) and assisted generation with the same draft model (assistant_model);
  4. the ideal: Leviathan et al.'s speedup from the measured per-position acceptance and step
     costs (specdec/benchmark/ideal.py), and measured / ideal as the system's efficiency;
  5. concurrency: N streams at once, speculation off, on and load-aware
     (specdec/benchmark/concurrency.py).
It prints tables and the goals met or missed, and writes results.json, the spans it read
(spans.jsonl) and four PNG plots into --out.

The stack is what `specdec up` runs (draft server subprocess, the target actor on a local Ray,
the coordinators in this process, gRPC on loopback); every tier writes its spans to one trace
file, from which the per-round figures come. Workloads ship in the package
(specdec/benchmark/prompts.py): copy (rewrites and edits of stdlib functions), free (prose and
code openers), mixed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import json
import os
import platform
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import torch
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from tqdm import tqdm

from specdec.benchmark import batch1, concurrency, flags, plots, report, serving
from specdec.benchmark import prompts as workloads
from specdec.benchmark.batch1 import Prompt
from specdec.benchmark.peer import hf_methods
from specdec.benchmark.provenance import git_commit
from specdec.benchmark.spans import read_requests
from specdec.benchmark.stack import coordinators, drafter_spec, stack_method
from specdec.coordinator.clients import DraftClient
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.server import ServerConfig
from specdec.drafts import loading as draft_loading
from specdec.drafts import shipped_draft
from specdec.local.stack import LocalStack, StackConfig, draft_server_ready, spawn_draft_server, terminate
from specdec.runtime.loading import load_model
from specdec.telemetry.trace_file import JsonLinesSpanExporter

POOL = "specdec-bench-suite"
_FLUSH_S = 1.5  # the draft server and the actors export spans every 0.5 s


def parse_args(argv: list[str]) -> argparse.Namespace:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    p = argparse.ArgumentParser(
        prog="specdec bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    _add_batch1_flags(p)
    _add_peer_flags(p)
    _add_concurrency_flags(p)
    _add_target_and_output_flags(p)
    args = p.parse_args(argv)
    _check_counts(p, args)
    _check_peer(p, args)
    return args


def _add_batch1_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        action="append",
        choices=(*workloads.SUITE_WORKLOADS, "all"),
        help="batch-1 workloads, repeatable (default: copy and free; all = the three)",
    )
    flags.add_prompts(p, 2, "prompts per batch-1 workload")
    flags.add_repeats(p, 3, "batch-1 repeats; figures are medians")
    flags.add_max_new_tokens(p, 64, "tokens per batch-1 request")
    flags.add_k(p, 8, "the most draft tokens a round; ours adapt below it")
    p.add_argument(
        "--model-drafter",
        default="auto",
        help="draft model: first:N (the target's first N layers), a model spec, 'distilled' (the shipped draft), "
        "or none; auto = distilled for the embedded target when shipped, else first:4 (default auto)",
    )
    p.add_argument(
        "--no-hybrid", action="store_true", help="leave out the hybrid arm (prompt lookup + the model drafter)"
    )


def _add_peer_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-peer", action="store_true", help="leave out transformers' methods")
    p.add_argument(
        "--peer",
        choices=("transformers", "vllm"),
        default="transformers",
        help="vllm: compare servers instead, `specdec up` against vLLM's OpenAI server through one client "
        "(specdec/benchmark/serving.py; --concurrency, --repeats, --max-new-tokens apply) (default transformers)",
    )
    p.add_argument("--peer-url", default=None, help="a vLLM OpenAI server already running (implies --peer vllm)")
    p.add_argument(
        "--peer-python",
        default=os.environ.get("SPECDEC_VLLM_PYTHON", "python3"),
        help="the Python of vLLM's own venv (default $SPECDEC_VLLM_PYTHON, else python3)",
    )
    p.add_argument("--peer-ngram", type=int, default=0, help="also run vLLM with its n-gram speculation at k N")
    p.add_argument(
        "--peer-sets",
        default="free,free_heldout,similar_heldout",
        help=f"prompt sets of the server comparison, comma separated, of {', '.join(serving.SETS)} "
        "(default free,free_heldout,similar_heldout)",
    )
    p.add_argument(
        "--peer-workload",
        default="cold,repeat",
        help="workloads of the server comparison, comma separated: cold (each prompt once in a fresh server's "
        "life, the headline) and repeat (--peer-sets sent again at every level) (default cold,repeat)",
    )
    p.add_argument(
        "--cold-serial-prompts",
        type=int,
        default=8,
        help="cold prompts one stream sends one after another; N streams send N (default 8)",
    )
    p.add_argument(
        "--specdec-flags",
        default="",
        help="flags for our `specdec up` in the server comparison, one string (e.g. '--itl-slo-ms 230')",
    )
    p.add_argument("--peer-prompts", type=int, default=4, help="prompts per set of the repeat workload (default 4)")
    p.add_argument("--peer-kv-gib", type=int, default=2, help="each server's KV cache in GiB (default 2)")


def _add_concurrency_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--concurrency", default="1,4,16,64", help="stream counts, comma separated; none to skip (default 1,4,16,64)"
    )
    p.add_argument(
        "--concurrency-prompts", type=int, default=8, help="mixed prompts the concurrency levels share (default 8)"
    )
    p.add_argument("--concurrency-new-tokens", type=int, default=64, help="tokens per concurrency request (default 64)")
    p.add_argument(
        "--concurrency-repeats",
        type=int,
        default=1,
        help="repeats of each concurrency cell; the median is kept (default 1)",
    )
    p.add_argument(
        "--load-aware-budget",
        type=int,
        default=16,
        help="the load-aware arm's speculation token budget: "
        "target positions per pass shared by the generating requests (default 16)",
    )
    p.add_argument(
        "--load-aware-running",
        type=int,
        default=0,
        help="the load-aware arm also stops drafting above this many generating requests (default 0: no such limit)",
    )


def _add_target_and_output_flags(p: argparse.ArgumentParser) -> None:
    flags.add_max_prompt_tokens(p)
    flags.add_target_model(p)
    p.add_argument(
        "--out",
        default="bench-results",
        help="directory for results.json, spans.jsonl and the plots (default ./bench-results)",
    )
    flags.add_json(p, "also write the JSON result here")
    p.add_argument(
        "--no-plots", action="store_true", help="write no PNG plots (they need matplotlib: pip install -e '.[bench]')"
    )


def _check_counts(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Parse the lists and refuse what would fail: before a 20-minute run, not after it."""
    if not args.no_plots and importlib.util.find_spec("matplotlib") is None:
        p.error("the plots need matplotlib: pip install -e '.[bench]' (or pass --no-plots)")
    chosen = args.workload or ["copy", "free"]
    args.workload = list(workloads.SUITE_WORKLOADS) if "all" in chosen else list(dict.fromkeys(chosen))
    try:
        args.concurrency = (
            [] if args.concurrency.lower() in ("", "none") else sorted({int(n) for n in args.concurrency.split(",")})
        )
    except ValueError:
        p.error(f"--concurrency: expected comma-separated stream counts, got {args.concurrency!r}")
    if args.load_aware_budget < 0 or args.load_aware_running < 0:
        p.error("--load-aware-budget and --load-aware-running must be >= 0")
    if any(n < 1 or n > 64 for n in args.concurrency):
        p.error("--concurrency: stream counts must be 1..64 (the coordinator's max_inflight)")
    for name in (
        "peer_prompts",
        "peer_kv_gib",
        "prompts",
        "repeats",
        "max_new_tokens",
        "k",
        "concurrency_prompts",
        "concurrency_new_tokens",
        "concurrency_repeats",
        "cold_serial_prompts",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")


def _check_peer(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.peer_url:
        args.peer = "vllm"
    args.peer_sets = [name for name in args.peer_sets.split(",") if name]
    args.specdec_flags = shlex.split(args.specdec_flags)
    args.peer_workload = [name for name in args.peer_workload.split(",") if name]
    if not args.peer_workload or set(args.peer_workload) - set(serving.WORKLOADS):
        p.error(f"--peer-workload: expected some of {', '.join(serving.WORKLOADS)}, got {','.join(args.peer_workload)}")
    if args.peer == "vllm" and (not args.concurrency or set(args.peer_sets) - set(serving.SETS)):
        p.error(f"--peer vllm: --peer-sets must name some of {', '.join(serving.SETS)}, --concurrency some levels")


def _encode(tokenizer, texts: list[tuple[str, str]], workload: str, max_prompt_tokens: int) -> list[Prompt]:
    out = []
    for label, text in texts:
        ids = tokenizer(text)["input_ids"]
        out.append(Prompt(workload, label, ids[-max_prompt_tokens:] if max_prompt_tokens else ids))
    return out


async def run(args: argparse.Namespace) -> dict:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    span_file = out_dir / "spans.jsonl"
    span_file.unlink(missing_ok=True)
    # This process's coordinators trace through a provider of their own (not the global one, which
    # a host process may own); the draft servers and the actors append to the same file.
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: "specdec-coordinator"}))
    provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(span_file), schedule_delay_millis=500))
    target = load_model(args.target_model)
    prompts, mixed = _prompts(args, target.tokenizer)
    draft_spec = None if args.model_drafter == "none" else drafter_spec(_model_drafter(args), args.target_model)
    assistant = draft_loading.load_model(draft_spec).model if draft_spec and not args.no_peer else None
    config = EngineConfig(default_draft_tokens=args.k, max_draft_tokens=max(args.k, 16), adaptive=True)
    stack_config = StackConfig(
        target_model=args.target_model,
        draft_model="ngram",
        pool_name=POOL,
        trace_file=str(span_file),
        metrics_port=0,
        server=ServerConfig(port=0),
        engine=config,
    )
    async with LocalStack(stack_config) as stack:
        # One more draft server per model arm: "model" serves the draft alone, "hybrid" with lookups.
        specs = {"model": draft_spec} if draft_spec else {}
        if draft_spec and not args.no_hybrid:
            specs["hybrid"] = f"hybrid:{draft_spec}"
        servers = {arm: await spawn_draft_server(spec, str(span_file)) for arm, spec in specs.items()}
        drafts = {arm: DraftClient((await draft_server_ready(server))[0]) for arm, server in servers.items()}
        try:
            tracer = provider.get_tracer("specdec.coordinator")
            peers = hf_methods(target.model, args.k, assistant) if not args.no_peer else {}
            runs, levels = await _measure(args, stack, config, tracer, drafts, peers, prompts, mixed)
            provider.force_flush()
            await asyncio.sleep(_FLUSH_S)  # the other processes' exporters, before the stack stops them
        finally:
            for client in drafts.values():
                await client.close()
            for server in servers.values():
                await terminate(server)
    provider.shutdown()
    results = _results(args, prompts, runs, levels, read_requests(span_file, _trace_ids(runs)))
    results["config"] |= {"model": target.name, "draft_model": draft_spec}
    results["goals"] = report.goals(results)
    return results


def _prompts(args: argparse.Namespace, tokenizer) -> tuple[list[Prompt], list[Prompt]]:
    """The batch-1 prompts of every chosen workload, and the mixed ones the concurrency levels share."""
    prompts = [
        p
        for w in args.workload
        for p in _encode(tokenizer, workloads.suite_workload(w, args.prompts), w, args.max_prompt_tokens)
    ]
    if not args.concurrency:
        return prompts, []
    mixed = workloads.suite_workload("mixed", args.concurrency_prompts)
    return prompts, _encode(tokenizer, mixed, "mixed", args.max_prompt_tokens)


async def _measure(args, stack, config, tracer, drafts, peers, prompts, mixed) -> tuple[list, dict | None]:
    """Batch 1 over every method, then the concurrency levels: (runs per prompt, levels or None)."""
    load_aware = replace(
        config, speculation_token_budget=args.load_aware_budget, speculation_max_running=args.load_aware_running
    )
    arms = {"ngram": (config, tracer), "load_aware": (load_aware, tracer)} | {arm: (config, tracer) for arm in drafts}
    async with coordinators(stack, args.target_model, arms, drafts or None) as stubs:
        methods = {
            "target_only": stack_method(stubs["ngram"], False, args.k),
            "ngram": stack_method(stubs["ngram"], True, args.k),
        }
        methods |= {arm: stack_method(stubs[arm], True, args.k) for arm in drafts}
        methods.update(peers)
        total = len(prompts) * args.repeats * len(methods)
        total += len(args.concurrency) * args.concurrency_repeats * len(concurrency.ARMS)
        with tqdm(total=total, desc="specdec bench", unit="run", file=sys.stderr) as progress:
            runs = (
                await batch1.measure(methods, prompts, args.repeats, args.max_new_tokens, progress) if prompts else []
            )
            if not args.concurrency:
                return runs, None
            levels = await concurrency.measure(
                {"on": stubs["ngram"], "load_aware": stubs["load_aware"]},
                args.concurrency,
                [p.ids for p in mixed],
                args.concurrency_new_tokens,
                args.k,
                args.concurrency_repeats,
                progress,
            )
    return runs, levels


def _trace_ids(runs: list) -> set[str]:
    return {
        run.trace_id for by_method in runs for method_runs in by_method.values() for run in method_runs if run.trace_id
    }


def _results(args: argparse.Namespace, prompts: list[Prompt], runs: list, levels: dict | None, requests) -> dict:
    """Every figure of the run, with greedy equality over batch 1 and the levels, and the config."""
    results: dict = {"batch1": None, "concurrency": levels}
    rows = [batch1.prompt_row(prompt, by_method, requests) for prompt, by_method in zip(prompts, runs)]
    if rows:
        results["batch1"] = {
            "prompts": rows,
            "summary": {w: batch1.summarize([r for r in rows if r["workload"] == w]) for w in args.workload},
        }
    equal = all(all(row["greedy_equal"].values()) for row in rows)
    if levels:
        equal = equal and concurrency.outputs_agree(levels)
        for by_level in levels.values():
            for cell in by_level.values():
                cell.pop("outputs")
    results["greedy_equal"] = equal
    results["config"] = {
        **vars(args),
        "model": None,
        "draft_model": None,
        "traced_requests": len(requests),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    return results


def _model_drafter(args: argparse.Namespace) -> str:
    """--model-drafter auto: the shipped distilled draft for the embedded target, else first:4."""
    if args.model_drafter != "auto":
        return args.model_drafter
    return (
        shipped_draft.DISTILLED if args.target_model in (None, "default") and shipped_draft.available() else "first:4"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.peer == "vllm":
        return serving.main(args)
    results = asyncio.run(run(args))
    out_dir = Path(args.out)
    text = json.dumps(results, indent=1)
    (out_dir / "results.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    report.print_report(results)
    for path in [] if args.no_plots else plots.draw_all(results, out_dir):
        print(f"wrote {path}", file=sys.stderr)
    print(f"wrote {out_dir / 'results.json'}", file=sys.stderr)
    return 0 if results["greedy_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
