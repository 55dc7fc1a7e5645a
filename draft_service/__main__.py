"""`python -m draft_service` / `specdec draft`: flags and environment onto `ServerConfig`, then serve.

Every flag --some-flag can also come from SPECDEC_DRAFT_SOME_FLAG (a flag given on the command
line wins). This is the only place that reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping

from specdec.core import flag_types
from specdec.draft_service.server import ServerConfig, serve
from specdec.draft_service.service import DraftConfig
from specdec.draft_service.suffix import SuffixConfig

ENV_PREFIX = "SPECDEC_DRAFT_"


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    defaults = DraftConfig()
    server = ServerConfig()
    p = argparse.ArgumentParser(
        prog="specdec draft",
        description="Serve the draft tier (specdec.v1.DraftService over gRPC). "
        f"Each flag may also be set by {ENV_PREFIX}<FLAG>, e.g. {ENV_PREFIX}MAX_BATCH.",
    )

    def flag(name: str, default, type, help: str) -> None:
        env = ENV_PREFIX + name.upper().replace("-", "_")
        # argparse runs `type` on string defaults, so an environment value is checked like a flag.
        p.add_argument(
            f"--{name}", default=environ.get(env, default), type=type, help=f"{help} [env {env}; default {default}]"
        )

    flag(
        "draft-model",
        server.draft_model,
        str,
        "local dir, .gguf file, hub id, 'ngram' (prompt lookup, no model), 'suffix' (suffix decoding over "
        "the request and earlier completions, no model), 'hybrid:<model>' (prompt lookup where the context "
        "repeats, the model elsewhere) or 'suffix:<model>' (suffix decoding where it matches, the model elsewhere)",
    )
    flag("host", server.host, str, "address to bind")
    flag("port", server.port, flag_types.port, "port to bind; 0 picks a free one (printed at start)")
    flag(
        "metrics-port", server.metrics_port, flag_types.port, "Prometheus metrics port (on --host); 0 picks a free one"
    )
    flag(
        "max-sessions",
        defaults.max_sessions,
        flag_types.positive_int,
        "sessions kept per replica (least recently used evicted beyond)",
    )
    flag(
        "max-cached-tokens",
        defaults.max_cached_tokens,
        flag_types.positive_int,
        "token positions kept over all sessions (LRU beyond)",
    )
    flag(
        "session-ttl",
        defaults.session_ttl_s,
        flag_types.seconds,
        "seconds an idle session is kept; 0 keeps it until LRU evicts it",
    )
    flag("max-batch", defaults.max_batch, flag_types.positive_int, "most Propose calls one batched model step serves")
    flag(
        "max-queue",
        defaults.max_queue,
        flag_types.positive_int,
        "calls waiting for the model beyond this get RESOURCE_EXHAUSTED",
    )
    flag("max-draft-tokens", defaults.max_draft_tokens, flag_types.positive_int, "largest k a call may ask for")
    flag(
        "min-confidence",
        "auto",
        flag_types.probability_or_auto,
        "greedy model drafts stop before a token the draft gives less probability than this; "
        "0 = off, auto = the draft's own (a distilled draft's draft.json), else off",
    )
    flag(
        "suffix-cache-tokens",
        server.suffix.max_cached_tokens,
        flag_types.positive_int,
        "completion tokens a suffix drafter ('suffix', 'suffix:SPEC') keeps from earlier requests, oldest out first",
    )
    flag("grace", server.grace_s, flag_types.seconds, "seconds in-flight calls get to finish after SIGTERM")
    flag(
        "drain-delay",
        server.drain_delay_s,
        flag_types.seconds,
        "seconds to report NOT_SERVING before refusing calls after SIGTERM",
    )
    flag(
        "auth-token",
        None,
        str,
        "calls but health checks must carry 'authorization: Bearer <token>' "
        "(prefer the env variable: flags show in ps)",
    )
    return p


def parse_config(argv: list[str], environ: Mapping[str, str] = os.environ) -> ServerConfig:
    args = _parser(environ).parse_args(argv)
    return ServerConfig(
        draft_model=args.draft_model,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        grace_s=args.grace,
        drain_delay_s=args.drain_delay,
        auth_token=args.auth_token or None,
        suffix=SuffixConfig(max_cached_tokens=args.suffix_cache_tokens),
        draft=DraftConfig(
            max_draft_tokens=args.max_draft_tokens,
            max_batch=args.max_batch,
            max_queue=args.max_queue,
            max_sessions=args.max_sessions,
            max_cached_tokens=args.max_cached_tokens,
            session_ttl_s=args.session_ttl or None,
            min_confidence=args.min_confidence,
        ),
    )


def main(argv: list[str] | None = None) -> int:
    config = parse_config(sys.argv[1:] if argv is None else argv)
    from specdec.telemetry.tracing import configure_tracing

    configure_tracing("specdec-draft")

    def listening(port: int, metrics_port: int) -> None:
        # Two lines, address last on each: `specdec up` reads them.
        print(f"draft service ({config.draft_model}) listening on {config.host}:{port}", flush=True)
        print(f"draft service metrics on {config.host}:{metrics_port}", flush=True)

    asyncio.run(serve(config, listening))
    return 0


if __name__ == "__main__":
    sys.exit(main())
