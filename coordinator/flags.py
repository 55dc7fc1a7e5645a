"""The engine's flags, declared once for `specdec coordinator` and for `specdec up` / `demo`.

`add_engine_flags` declares them through the caller's `flag(name, default, type, help, metavar)`,
which decides where a default may come from (the coordinator's SPECDEC_COORDINATOR_* environment)
and how the help shows it; `engine_config` turns the parsed flags into an `EngineConfig`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.server import ServerConfig
from specdec.core import flag_types

# flag(name, default, type, help, metavar=None): adds --name to a parser.
AddFlag = Callable[..., None]
ON_OFF = "{on,off}"
HTTP_PORT = 8000  # the OpenAI-compatible API's, as vLLM's


def add_engine_flags(flag: AddFlag) -> None:
    """The flags of the engine, and --max-inflight, the admission in front of it."""
    engine, server = EngineConfig(), ServerConfig()
    flag("max-draft-tokens", engine.max_draft_tokens, flag_types.positive_int, "largest k a request may ask for")
    flag(
        "default-draft-tokens",
        engine.default_draft_tokens,
        flag_types.nonnegative_int,
        "k for requests that leave it unset",
    )
    flag(
        "max-inflight",
        server.max_inflight,
        flag_types.positive_int,
        "requests generating at once; more get RESOURCE_EXHAUSTED",
    )
    flag(
        "pipeline",
        "on" if engine.pipeline else "off",
        flag_types.on_off,
        "'on': draft round r+1 while round r is verified",
        metavar=ON_OFF,
    )
    flag(
        "token-tree",
        "on" if engine.token_tree else "off",
        flag_types.on_off,
        "'on': ask the draft tier for token trees of up to k nodes, verified in one pass (suffix drafting)",
        metavar=ON_OFF,
    )
    flag(
        "adaptive",
        "on" if engine.adaptive else "off",
        flag_types.on_off,
        "'on': each round's k from the request's acceptance and the measured costs, at most the request's max",
        metavar=ON_OFF,
    )
    flag(
        "speculation-max-running",
        engine.speculation_max_running,
        flag_types.nonnegative_int,
        "with more requests generating than this, rounds run without drafts (target saturated); 0: never",
    )
    flag(
        "speculation-token-budget",
        "auto",
        flag_types.nonnegative_int_or_auto,
        "target positions per batched pass shared by the generating requests: "
        "each drafts at most budget / running - 1 tokens; 0: no budget; auto: 16 on a CPU target, none on a GPU",
    )
    flag(
        "chat-template",
        None,
        str,
        "Jinja chat template file for requests that send messages (for a model whose tokenizer has none)",
        metavar="FILE",
    )
    flag(
        "draft-timeout",
        engine.draft_timeout_s,
        flag_types.positive_seconds,
        "a proposal later than this is dropped (that round runs with k = 0)",
    )


def add_http_flags(flag: AddFlag, port: int) -> None:
    """The OpenAI-compatible HTTP API's flags (coordinator/http_api.py)."""
    flag(
        "http-port",
        port,
        flag_types.port,
        "port of the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions) on the same host; 0: none",
    )
    flag("served-model-name", None, str, "the model's id in the HTTP API (default: the target model's name)")


def server_config(args: argparse.Namespace, **more) -> ServerConfig:
    """The `ServerConfig` of the parsed --host, --port, the HTTP flags and --max-inflight (the
    flag's --http-port 0 is `http_port` None: no HTTP API), with `more` fields."""
    return ServerConfig(
        host=args.host,
        port=args.port,
        http_port=args.http_port or None,
        served_model_name=args.served_model_name,
        max_inflight=args.max_inflight,
        api_key=getattr(args, "api_key", None) or None,
        **more,
    )


def plain_flag(p: argparse.ArgumentParser) -> AddFlag:
    """`flag` for a parser that reads no environment: the help ends with the default."""

    def flag(name: str, default, type, help: str, metavar: str | None = None) -> None:
        p.add_argument(f"--{name}", default=default, type=type, metavar=metavar, help=f"{help} (default {default})")

    return flag


def engine_config(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> EngineConfig:
    """The `EngineConfig` of parsed engine flags; `error` (a parser's) refuses a default k above the
    largest a request may ask for."""
    if args.default_draft_tokens > args.max_draft_tokens:
        error(f"--default-draft-tokens {args.default_draft_tokens} exceeds --max-draft-tokens {args.max_draft_tokens}")
    chat_template = None
    if args.chat_template:
        try:
            chat_template = Path(args.chat_template).read_text()
        except (OSError, UnicodeDecodeError) as e:
            error(f"--chat-template: cannot read {args.chat_template}: {e}")
    return EngineConfig(
        default_draft_tokens=args.default_draft_tokens,
        max_draft_tokens=args.max_draft_tokens,
        pipeline=args.pipeline,
        token_tree=args.token_tree,
        adaptive=args.adaptive,
        speculation_max_running=args.speculation_max_running,
        speculation_token_budget=args.speculation_token_budget,
        draft_timeout_s=args.draft_timeout,
        chat_template=chat_template,
    )
