"""The `specdec` command. Flags map onto config dataclasses here and nowhere deeper.

  specdec demo                             start the local stack, stream one request through it, stop it
  specdec up                               serve the local stack (draft, target pool, coordinator) until Ctrl-C
  specdec generate "prompt"                one request to a running coordinator (--address, --stream)
  specdec generate --in-process "prompt"   one request through the single-process engine
  specdec trace ID | --last                one request's rounds from the trace file `specdec up` writes
  specdec plan --costs FILE --rate R ...   target and draft replicas for a load, from a bench's costs
  specdec coordinator ...                  the coordinator alone (flags: python -m specdec.coordinator --help)
  specdec draft ...                        the draft tier (flags: python -m specdec.draft_service --help)
  specdec target ...                       the target actor pool (python -m specdec.target_service --help)
  specdec bench ...                        the benchmark suite (bench/README.md)
  specdec distill-draft --out DIR          distil a draft model from the target

grpc and ray are imported only inside the commands that use them: the core stays free of both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from specdec.cli.config_flags import add_flags, from_flags
from specdec.drafts.shipped_draft import AUTO, resolve_drafter

DEFAULT_ADDRESS = "127.0.0.1:50051"
API_KEY_ENV = "SPECDEC_API_KEY"  # `specdec up`'s and `specdec generate`'s --api-key default
# Prompt lookup drafts well when the output repeats the prompt, as code does: the embedded model
# writes sub, mul and div after this, with most of the drafts accepted.
DEMO_PROMPT = "def add(a: int, b: int) -> int:\n    return a + b\n\n\ndef sub("


def _add_model_flags(p: argparse.ArgumentParser, scope: str = "") -> None:
    p.add_argument(
        "--target-model", default=None, help=f"local dir, .gguf file or hub id (default: embedded Gemma 3 270M){scope}"
    )
    p.add_argument(
        "--draft-model",
        default=AUTO,
        help="local dir, .gguf file, hub id, 'distilled' (the draft shipped for the embedded target), "
        "'ngram' (prompt lookup), 'suffix' (suffix decoding over the request and earlier completions), "
        "'hybrid:SPEC' (prompt lookup where the context repeats, SPEC elsewhere), 'suffix:SPEC' (suffix "
        "decoding where it matches, SPEC elsewhere), "
        f"or 'auto': the drafter chosen on held-out prompts, suffix (default){scope}",
    )


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt (a running coordinator, or --in-process)")
    p.add_argument("prompt")
    p.add_argument(
        "--address", default=DEFAULT_ADDRESS, help=f"the coordinator's host:port (default {DEFAULT_ADDRESS})"
    )
    p.add_argument("--stream", action="store_true", help="print the text as it is generated (GenerateStream)")
    p.add_argument("--timeout", type=float, default=None, help="deadline of the call in seconds (default: none)")
    p.add_argument(
        "--tls-ca",
        default=None,
        help="PEM file of the CA that signed the coordinator's certificate: call over TLS (default: plaintext)",
    )
    _add_api_key_flag(p, "the coordinator's API key, sent as 'authorization: Bearer <key>'")
    p.add_argument("--in-process", action="store_true", help="run draft, target and engine in this process")
    _add_model_flags(p, scope="; --in-process only")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    p.add_argument("--top-p", type=float, default=0.0, help="0 means 1 (off)")
    p.add_argument("--top-k", type=int, default=0, help="0 means off")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--max-draft-tokens", type=int, default=0, help="k; 0 means the default")
    p.add_argument("--no-speculation", action="store_true", help="target-only decoding (k = 0)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the GenerateResponse in protobuf's JSON mapping (--stream: one message a line)",
    )


def _add_stack_flags(p: argparse.ArgumentParser, port: int) -> None:
    from specdec.coordinator.engine import EngineConfig
    from specdec.coordinator.server import HTTP_PORT, ServerConfig
    from specdec.local.stack import StackConfig

    _add_model_flags(p)
    add_flags(p, StackConfig, defaults={"metrics_port": 9464 if port else 0})
    # demo (port 0) serves no HTTP; --api-key is _add_api_key_flag's
    add_flags(
        p, ServerConfig, skip=("grace_s", "api_key"), defaults={"port": port, "http_port": HTTP_PORT if port else 0}
    )
    add_flags(p, EngineConfig)
    _add_api_key_flag(p, "clients of both APIs must send 'authorization: Bearer <key>' (health exempt)")


def _add_api_key_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"{what} (default: ${API_KEY_ENV}, else none; prefer the variable: flags show in ps)",
    )


def _request_proto(args):
    from specdec.v1 import common_pb2, generation_pb2

    sampling = common_pb2.SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=max(args.top_k, 0))
    if args.seed is not None:
        sampling.seed = args.seed
    return generation_pb2.GenerateRequest(
        prompt=args.prompt,
        max_new_tokens=max(args.max_new_tokens, 0),
        sampling=sampling,
        stop=args.stop,
        speculation=generation_pb2.SpeculationParams(
            disabled=args.no_speculation, max_draft_tokens=max(args.max_draft_tokens, 0)
        ),
    )


def _summary(response, seconds: float, tail: str) -> str:
    """One line: speed, speculation statistics, finish reason, and `tail`."""
    from specdec.v1 import generation_pb2 as pb

    stats = response.speculation
    n = len(response.token_ids)
    acceptance = stats.accepted_tokens / stats.draft_tokens if stats.draft_tokens else 0.0
    mean_accepted = (stats.accepted_tokens + stats.rounds) / stats.rounds if stats.rounds else 0.0
    finish = pb.FinishReason.Name(response.finish_reason).removeprefix("FINISH_REASON_").lower()
    split = ""
    if stats.generation_seconds > 0:
        draft, verify = (
            stats.draft_wait_seconds / stats.generation_seconds,
            stats.verify_wait_seconds / stats.generation_seconds,
        )
        split = f"time: draft {draft:.0%}, verify {verify:.0%}, coordinator {max(0.0, 1 - draft - verify):.0%} | "
    return (
        f"[{n} tokens in {seconds:.2f} s: {n / seconds:.1f} tokens/s | "
        f"{stats.rounds} rounds, acceptance {acceptance:.0%} ({stats.accepted_tokens}/{stats.draft_tokens}), "
        f"{mean_accepted:.2f} tokens per round | {split}finish: {finish} | {tail}]"
    )


def _cmd_generate(args) -> int:
    for name in ("max_new_tokens", "top_k", "max_draft_tokens"):
        if getattr(args, name) < 0:  # uint32 on the wire: refuse here rather than wrap around
            print(f"invalid argument: {name}: must be >= 0", file=sys.stderr)
            return 2
    if not args.in_process:
        tls_ca = None
        if args.tls_ca:
            from pathlib import Path

            try:
                tls_ca = Path(args.tls_ca).read_bytes()
            except OSError as e:
                print(f"specdec generate: --tls-ca: {e}", file=sys.stderr)
                return 2
        return asyncio.run(
            call_coordinator(
                args.address,
                _request_proto(args),
                stream=args.stream,
                as_json=args.json,
                timeout_s=args.timeout,
                tls_ca=tls_ca,
                api_key=args.api_key,
            )
        )
    from google.protobuf import json_format

    from specdec.coordinator.convert import request_from_proto, response_to_proto
    from specdec.core.errors import InvalidArgument
    from specdec.draft_service.hybrid import parse_spec, uses_suffix
    from specdec.local.in_process import build_engine, load_pair
    from specdec.runtime.models import UnservableModel

    drafter = resolve_drafter(args.draft_model, args.target_model)
    try:
        target, draft = load_pair(args.target_model, drafter)
    except UnservableModel as e:
        print(f"specdec generate: {e}", file=sys.stderr)
        return 2
    engine = build_engine(target, draft, hybrid=parse_spec(drafter) is not None, suffix=uses_suffix(drafter))
    try:
        start = time.perf_counter()
        result = asyncio.run(engine.generate(request_from_proto(_request_proto(args))))
        seconds = time.perf_counter() - start
    except InvalidArgument as e:
        print(f"invalid argument: {e}", file=sys.stderr)
        return 2
    response = response_to_proto(result)
    if args.json:
        print(json.dumps(_with_decoders(json_format.MessageToDict(response), target, draft), indent=2))
    else:
        print(result.text)
    print(
        "\n" + _summary(response, seconds, f"target {target.name}, draft {drafter}"), file=sys.stderr
    )  # stderr: stdout stays JSON with --json
    return 0


def _with_decoders(reply: dict, target, draft) -> dict:
    """The response as JSON with the decoders that ran it named: `targetDecoder`, and
    `draftDecoder` where a draft model drafted ("fused" or "transformers")."""
    from specdec.runtime.paged_decoder import decoder_name

    reply["targetDecoder"] = decoder_name(target.model)
    if draft is not None:
        reply["draftDecoder"] = decoder_name(draft.model)
    return reply


async def call_coordinator(
    address: str,
    request,
    *,
    stream: bool,
    as_json: bool = False,
    timeout_s: float | None = None,
    summary_file=None,
    tls_ca: bytes | None = None,
    api_key: str | None = None,
) -> int:
    """Send `request` (a GenerateRequest) to the coordinator at `address` and print the text (as
    it arrives when `stream`), then the statistics and the trace id to `summary_file` (stderr).
    `tls_ca` (PEM): call over TLS, trusting that CA; `api_key`: sent as a bearer token."""
    import grpc
    from google.protobuf import json_format

    from specdec.v1 import generation_pb2_grpc

    summary_file = summary_file or sys.stderr
    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
    start = time.perf_counter()
    first_token_s = None
    async with _channel(address, tls_ca) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        try:
            if stream:
                response, first_token_s = await _print_stream(stub, request, timeout_s, metadata, as_json, start)
            else:
                response = await stub.Generate(request, timeout=timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            if stream and not as_json:
                print(file=sys.stdout)
            return _rpc_failed(e, address)
    seconds = time.perf_counter() - start
    if as_json:
        if not stream:
            print(json_format.MessageToJson(response))
        return 0
    print(response.text if not stream else "")
    tail = f"trace {response.trace_id or '(tracing off)'}"
    if first_token_s is not None:
        tail = f"first token after {first_token_s:.2f} s | {tail}"
    print("\n" + _summary(response, seconds, tail), file=summary_file, flush=True)
    return 0


def _channel(address: str, tls_ca: bytes | None):
    import grpc

    if tls_ca is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=tls_ca))


async def _print_stream(stub, request, timeout_s, metadata, as_json: bool, start: float):
    """GenerateStream: print each message as it arrives (its text, or itself as one JSON line),
    and gather them into the GenerateResponse the unary call would have returned. Returns it and
    the seconds from `start` to the first token (None if none came)."""
    from google.protobuf import json_format

    from specdec.v1 import generation_pb2 as pb

    response = pb.GenerateResponse()
    first_token_s = None
    # Same fields, same numbers: the stream request is the unary one re-read.
    async for message in stub.GenerateStream(
        pb.GenerateStreamRequest.FromString(request.SerializeToString()), timeout=timeout_s, metadata=metadata
    ):
        if first_token_s is None and message.token_ids:
            first_token_s = time.perf_counter() - start
        if as_json:
            print(json_format.MessageToJson(message, indent=None), flush=True)
        else:
            print(message.text, end="", flush=True)
        response.text += message.text
        response.token_ids.extend(message.token_ids)
        response.trace_id = message.trace_id
        if message.finish_reason:
            response.finish_reason = message.finish_reason
            response.usage.CopyFrom(message.usage)
            response.speculation.CopyFrom(message.speculation)
    return response, first_token_s


def _rpc_failed(error, address: str) -> int:
    import grpc

    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        print(f"invalid argument: {details}", file=sys.stderr)
        return 2
    print(f"specdec generate: {code.name}: {details}", file=sys.stderr)
    if code == grpc.StatusCode.UNAVAILABLE and "connect" in details:
        print(
            f"no coordinator answers at {address}: start one with `specdec up` (or pass --address, or --in-process)",
            file=sys.stderr,
        )
    return 1


def _stack_config(args, error):
    from specdec.coordinator.__main__ import engine_config, server_config
    from specdec.local.stack import StackConfig

    if args.target_replicas < 1:
        raise SystemExit(f"specdec {args.command}: --target-replicas must be >= 1")
    return from_flags(
        StackConfig,
        args,
        draft_model=resolve_drafter(args.draft_model, args.target_model),
        target_model=args.target_model,
        trace_file=args.trace_file or None,
        server=server_config(args),
        engine=engine_config(args, error),
    )


def _print_parts(stack) -> None:
    c = stack.config
    actors = f"{len(stack.actor_names)} actor{'s' if len(stack.actor_names) != 1 else ''}"
    print(
        f"  draft service   {stack.draft_address}  ({c.draft_model}, process {stack.draft_process.pid}); "
        f"metrics {stack.draft_metrics_address}",
        flush=True,
    )
    print(
        f"  target pool     {c.pool_name}: {actors} on the local Ray ({stack.target_name}); "
        f"metrics {', '.join(stack.target_metrics_addresses)}",
        flush=True,
    )
    print(
        f"  coordinator     {stack.address}  (specdec.v1.GenerationService, health, reflection); "
        f"metrics {stack.metrics.address}",
        flush=True,
    )
    if stack.server.http is not None:
        host = c.server.host
        print(
            f"  HTTP API        http://{host}:{stack.server.http_port}/v1  (OpenAI-compatible: completions, "
            f"chat/completions, models; model id {stack.server.http.api.served_model!r})",
            flush=True,
        )
    if c.trace_file:
        print(
            f"  traces          {c.trace_file}  (every part's spans; `specdec trace --last` shows the latest request)",
            flush=True,
        )


async def _up(config, status_every_s: float) -> int:
    import signal

    from specdec.local.stack import LocalStack

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

    on_signals()
    print("starting the local stack (the first start converts the embedded model: about 90 s) ...", flush=True)
    async with LocalStack(config) as stack:
        # Again: starting Ray installs its own SIGTERM handler, which dumps a stack and exits at
        # once (measured: the draft server and the actors were left to fend for themselves).
        on_signals()
        _print_parts(stack)
        print(
            f'serving; try: specdec generate --address {stack.address} --stream "..."   (Ctrl-C stops every part)',
            flush=True,
        )
        status = _StatusLine(stack.server.stats)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), status_every_s)
            except TimeoutError:
                status.show()
        print("\nstopping ...", flush=True)
    print("stopped", flush=True)
    return 0


class _StatusLine:
    """Requests, tokens/s over the last interval and acceptance; rewritten in place on a terminal,
    a new line only when something changed otherwise (logs stay readable)."""

    def __init__(self, stats):
        self.stats = stats
        self.tty = sys.stdout.isatty()
        self.at, self.tokens, self.last = time.monotonic(), stats.completion_tokens, ""

    def show(self) -> None:
        s, now = self.stats, time.monotonic()
        rate = (s.completion_tokens - self.tokens) / (now - self.at)
        acceptance = (
            f"{s.accepted_tokens / s.draft_tokens:.0%} ({s.accepted_tokens}/{s.draft_tokens} drafts)"
            if s.draft_tokens
            else "-"
        )
        counts = (
            f"requests {s.requests} done ({s.failed} failed), {s.in_flight} in flight | {s.completion_tokens} tokens"
        )
        line = f"{counts}, {rate:.1f} tokens/s over the last {now - self.at:.0f} s | acceptance {acceptance}"
        if self.tty:
            print("\r\033[K" + line, end="", flush=True)
        elif counts != self.last or rate > 0:
            print(line, flush=True)
        self.last, self.at, self.tokens = counts, now, s.completion_tokens


async def _demo(config, prompt: str, max_new_tokens: int) -> int:
    from specdec.local.stack import LocalStack
    from specdec.v1 import common_pb2, generation_pb2

    print("starting the local stack (the first start converts the embedded model: about 90 s) ...", flush=True)
    async with LocalStack(config) as stack:
        _print_parts(stack)
        request = generation_pb2.GenerateRequest(
            prompt=prompt, max_new_tokens=max_new_tokens, sampling=common_pb2.SamplingParams(temperature=0.0)
        )
        dimmed = " dimmed" if sys.stdout.isatty() else ""
        print(
            f"\nGenerateStream to {stack.address}, greedy, {max_new_tokens} tokens at most "
            f"(the prompt{dimmed}, then the stream):\n",
            flush=True,
        )
        print(f"\033[2m{prompt}\033[0m" if sys.stdout.isatty() else prompt, end="", flush=True)
        code = await call_coordinator(stack.address, request, stream=True, summary_file=sys.stdout)
        print("\nstopping the stack ...", flush=True)
    print("stopped", flush=True)
    return code


def _plan_parser(sub) -> argparse.ArgumentParser:
    from specdec.plan import PlanConfig

    p = sub.add_parser(
        "plan",
        help="target and draft replicas a load needs, with the expected tokens/s, ITL and TTFT (docs/planning.md)",
    )
    add_flags(p, PlanConfig)
    return p


def _cmd_plan(args) -> int:
    import json

    from specdec.plan import PlanConfig, PlanError, load_costs, plan, report

    config = from_flags(PlanConfig, args)
    try:
        result = plan(config, load_costs(config.costs))
    except PlanError as e:
        print(f"specdec plan: {e}", file=sys.stderr)
        return 2
    print("\n".join(report(config, result)))
    if config.json_path:
        with open(config.json_path, "w") as f:
            json.dump({"config": vars(args) | {"command": "plan"}, "plan": result.as_dict()}, f, indent=1)
    return 0


def _cmd_trace(args, parser) -> int:
    from pathlib import Path

    from specdec.cli.trace_view import default_trace_file, show

    if bool(args.trace_id) == args.last:
        parser.error("specdec trace: give a trace id or --last")
    status, lines = show(args.trace_id, Path(args.file) if args.file else default_trace_file(), args.last)
    print("\n".join(lines), file=sys.stdout if status == 0 else sys.stderr)
    return status


# Subcommands that own their flags: `specdec draft ...` parses exactly like `python -m specdec.draft_service ...`.
_DELEGATED = {
    "coordinator": (
        "specdec.coordinator.__main__",
        "serve the public GenerationService over a draft tier and a target pool",
    ),
    "draft": ("specdec.draft_service.__main__", "serve the draft tier (DraftService over gRPC)"),
    "target": ("specdec.target_service.__main__", "start or resize the target actor pool on Ray"),
    "fetch-models": (
        "specdec.cli.fetch_models",
        "download hub models into a directory, once, for pods that load them from there",
    ),
    "distill-draft": (
        "specdec.distill.train",
        "distil a small pruned-vocabulary draft model from a target (resumable)",
    ),
    "bench": (
        "specdec.benchmark.run",
        "the benchmark suite: speculation vs target-only vs transformers, batch 1 and under concurrency "
        "(bench/README.md)",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _DELEGATED:
        import importlib

        return importlib.import_module(_DELEGATED[argv[0]][0]).main(argv[1:])
    parser = argparse.ArgumentParser(prog="specdec", description="Distributed speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    # `demo` and `up` get their flags only when they run: the engine's flags import the engine
    # (transformers, a slow import), which no other command needs.
    stack = {
        "demo": sub.add_parser(
            "demo", help="start the local stack, stream one request through its gRPC API, print it, stop"
        ),
        "up": sub.add_parser("up", help="serve the local stack (draft server, target pool, coordinator) until Ctrl-C"),
    }
    if argv[:1] == ["demo"]:
        _add_stack_flags(stack["demo"], port=0)
        stack["demo"].add_argument("--prompt", default=DEMO_PROMPT)
        stack["demo"].add_argument("--max-new-tokens", type=int, default=48)
    elif argv[:1] == ["up"]:
        _add_stack_flags(stack["up"], port=50051)
        stack["up"].add_argument("--status-every", type=float, default=5.0, help="seconds between status lines")
    _generate_parser(sub)
    tr = sub.add_parser("trace", help="print one request's rounds from the local trace file that `specdec up` writes")
    tr.add_argument("trace_id", nargs="?", help="the trace id a response carries (32 hex digits)")
    tr.add_argument("--last", action="store_true", help="the request that finished last")
    tr.add_argument("--file", default=None, help="the trace file (default ~/.cache/specdec/traces.jsonl)")
    _plan_parser(sub)
    for name, (_, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)  # listed in --help; handled above
    args = parser.parse_args(argv)
    if args.command == "generate":
        return _cmd_generate(args)
    if args.command == "trace":
        return _cmd_trace(args, parser)
    if args.command == "plan":
        return _cmd_plan(args)
    return _cmd_stack(args, stack[args.command].error)


def _cmd_stack(args, error) -> int:
    """`specdec up` or `specdec demo`: start the local stack, serve or stream once, stop every part."""
    from specdec.cli.trace_view import default_trace_file
    from specdec.telemetry.tracing import configure_tracing

    if args.trace_file is None:
        args.trace_file = str(default_trace_file())
    config = _stack_config(args, error)
    configure_tracing("specdec-coordinator", file=config.trace_file)
    if args.command == "up":  # one line per request (demo prints its own summary)
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from specdec.runtime.models import UnservableModel

    try:
        if args.command == "up":
            return asyncio.run(_up(config, args.status_every))
        return asyncio.run(_demo(config, args.prompt, args.max_new_tokens))
    except UnservableModel as e:  # refused by the stack's first step, before any part starts
        print(f"specdec {args.command}: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        # A part that did not start (a busy port, a draft server that exited); the rest was stopped.
        print(f"specdec {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
