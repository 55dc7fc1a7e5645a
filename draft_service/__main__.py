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

from specdec.cli.config_flags import add_flags, from_flags
from specdec.draft_service.server import ServerConfig, serve
from specdec.draft_service.service import DraftConfig
from specdec.draft_service.suffix import SuffixConfig

ENV_PREFIX = "SPECDEC_DRAFT_"
CONFIGS = (ServerConfig, DraftConfig, SuffixConfig)  # the settings behind the flags


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdec draft",
        description="Serve the draft tier (specdec.v1.DraftService over gRPC). "
        f"Each flag may also be set by {ENV_PREFIX}<FLAG>, e.g. {ENV_PREFIX}MAX_BATCH.",
    )
    for cls in CONFIGS:
        add_flags(p, cls, env_prefix=ENV_PREFIX, environ=environ)
    return p


def parse_config(argv: list[str], environ: Mapping[str, str] = os.environ) -> ServerConfig:
    args = _parser(environ).parse_args(argv)
    return from_flags(
        ServerConfig,
        args,
        auth_token=args.auth_token or None,
        suffix=from_flags(SuffixConfig, args),
        draft=from_flags(DraftConfig, args, session_ttl_s=args.session_ttl or None),
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
