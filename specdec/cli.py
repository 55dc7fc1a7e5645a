"""The `specdec` command. Flags map onto config dataclasses here and nowhere deeper.

Subcommands grow with the services (`coordinator`, `up`, `trace` are to come); today:
  specdec generate --in-process "prompt"   one request through the single-process engine
  specdec draft ...                        the draft tier (flags: python -m draft_service --help)
  specdec target ...                       the target actor pool (python -m target_service --help)
  specdec bench ...                        the single-process benchmark (bench/)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target-model", default=None, help="local dir, .gguf file or hub id (default: embedded Gemma 3 270M)")
    p.add_argument("--draft-model", default="ngram", help="local dir, .gguf file, hub id, or 'ngram' (default)")


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt")
    p.add_argument("prompt")
    p.add_argument("--in-process", action="store_true", help="run draft, target and engine in this process")
    _add_model_flags(p)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    p.add_argument("--top-p", type=float, default=0.0, help="0 means 1 (off)")
    p.add_argument("--top-k", type=int, default=0, help="0 means off")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--max-draft-tokens", type=int, default=0, help="k; 0 means the default")
    p.add_argument("--no-speculation", action="store_true", help="target-only decoding (k = 0)")
    p.add_argument("--json", action="store_true", help="print the GenerateResponse in protobuf's JSON mapping")


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
        speculation=generation_pb2.SpeculationParams(disabled=args.no_speculation, max_draft_tokens=max(args.max_draft_tokens, 0)),
    )


def _cmd_generate(args) -> int:
    if not args.in_process:
        print("specdec generate: no coordinator client yet; pass --in-process", file=sys.stderr)
        return 2
    from google.protobuf import json_format

    from coordinator.convert import request_from_proto, response_to_proto
    from coordinator.local import build_engine, load_pair
    from specdec.errors import InvalidArgument

    for name in ("max_new_tokens", "top_k", "max_draft_tokens"):
        if getattr(args, name) < 0:  # uint32 on the wire: refuse here rather than wrap around
            print(f"invalid argument: {name}: must be >= 0", file=sys.stderr)
            return 2
    target, draft = load_pair(args.target_model, args.draft_model)
    engine = build_engine(target, draft)
    try:
        start = time.perf_counter()
        result = asyncio.run(engine.generate(request_from_proto(_request_proto(args))))
        seconds = time.perf_counter() - start
    except InvalidArgument as e:
        print(f"invalid argument: {e}", file=sys.stderr)
        return 2
    response = response_to_proto(result)
    if args.json:
        print(json_format.MessageToJson(response))
        return 0
    stats = result.stats
    print(result.text)
    mean_accepted = (stats.accepted_tokens + stats.rounds) / stats.rounds if stats.rounds else 0.0
    print(
        f"\n[{len(result.token_ids)} tokens in {seconds:.2f} s: {len(result.token_ids) / seconds:.1f} tokens/s | "
        f"{stats.rounds} rounds, acceptance {stats.acceptance_rate:.0%} ({stats.accepted_tokens}/{stats.draft_tokens}), "
        f"{mean_accepted:.2f} tokens per round | finish: {result.finish_reason.value} | "
        f"target {target.name}, draft {draft.name if draft else 'ngram'}]",
        file=sys.stderr,
    )
    return 0


# Subcommands that own their flags: `specdec draft ...` parses exactly like `python -m draft_service ...`.
_DELEGATED = {
    "draft": ("draft_service.__main__", "serve the draft tier (DraftService over gRPC)"),
    "target": ("target_service.__main__", "start or resize the target actor pool on Ray"),
    "bench": ("bench.single_process", "the single-process benchmark (bench/README.md)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _DELEGATED:
        import importlib

        return importlib.import_module(_DELEGATED[argv[0]][0]).main(argv[1:])
    parser = argparse.ArgumentParser(prog="specdec", description="Distributed speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    for name, (_, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)  # listed in --help; handled above
    args = parser.parse_args(argv)
    return _cmd_generate(args)


if __name__ == "__main__":
    sys.exit(main())
