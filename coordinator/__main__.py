"""`python -m coordinator` / `specdec coordinator`: serve GenerationService over running tiers.

The draft tier is a DraftService address (`host:port`, comma-separated replicas, or
`dns:///name:port`); the target tier is a pool of named Ray actors (`specdec target`) joined
through `--ray-address` (a Ray with token authentication reads RAY_AUTH_TOKEN); a draft tier
that wants a token gets `--draft-auth-token`; `--tls-cert`/`--tls-key` serve TLS. Every flag
--some-flag can also come from SPECDEC_COORDINATOR_SOME_FLAG (a flag given on the command line
wins); this is the only place that reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from specdec.cli.config_flags import add_flags, from_flags
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.server import ServerConfig
from specdec.core.settings import setting

log = logging.getLogger(__name__)

ENV_PREFIX = "SPECDEC_COORDINATOR_"


@dataclass(frozen=True)
class CoordinatorConfig:
    draft: str = setting(help="DraftService address: host:port, several comma-separated, or dns:///name:port")
    target_pool: str = setting(help="target actor name prefix (actors <name>-0 .. <name>-(n-1))")
    namespace: str = setting(help="Ray namespace of the target pool")
    server: ServerConfig = field(default_factory=ServerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    ray_address: str = setting("auto", "Ray cluster to join ('auto': the one running on this machine)")
    # Join as a Ray node of our own and run as a driver there.
    ray_join: str | None = setting(
        None,
        "GCS address (HOST:PORT) of the Ray cluster to join as a node of this process's own, with no CPUs "
        "or GPUs, running as a driver on it: verify calls then go to the actors directly, never through "
        "the head (Ray's ports must be open between this host and the cluster's); replaces --ray-address",
        type="gcs_address",
        metavar="HOST:PORT",
    )
    pool_wait_s: float = setting(
        0.0,
        "seconds to wait at start for the target pool's first actor (pods start in any order, and a "
        "restarted Ray head has no actors until the keeper recreates them); 0: fail at once",
        type="seconds",
    )
    target_model: str | None = setting(  # the tokenizer's spec
        None, "model spec to load the tokenizer from (default: the model the pool reports)"
    )
    metrics_port: int = setting(9464, "Prometheus metrics port (on --host); 0 picks a free one", type="port")
    tls_cert: str | None = setting(None, "PEM certificate chain file: serve TLS (with --tls-key) instead of plaintext")
    tls_key: str | None = setting(None, "PEM private key file of --tls-cert")
    draft_auth_token: str | None = setting(  # sent as 'authorization: Bearer <token>'
        None,
        "token the draft tier requires (its --auth-token); prefer the env variable: flags show in ps",
        repr=False,
        secret=True,
    )
    pool_check_s: float = 2.0  # how often health checks that an actor of the pool answers


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    from specdec.target_service.pool import NAMESPACE, PREFIX

    p = argparse.ArgumentParser(
        prog="specdec coordinator",
        description="Serve specdec.v1.GenerationService over a draft tier and a target pool. "
        f"Each flag may also be set by {ENV_PREFIX}<FLAG>.",
    )
    pool = {"target_pool": PREFIX, "namespace": NAMESPACE}
    add_flags(p, CoordinatorConfig, defaults=pool, env_prefix=ENV_PREFIX, environ=environ)
    add_flags(p, ServerConfig, env_prefix=ENV_PREFIX, environ=environ)
    add_flags(p, EngineConfig, env_prefix=ENV_PREFIX, environ=environ)
    return p


def parse_config(argv: list[str], environ: Mapping[str, str] = os.environ) -> CoordinatorConfig:
    p = _parser(environ)
    args = p.parse_args(argv)
    engine = engine_config(args, p.error)
    tls = None
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    if args.tls_cert:
        try:
            tls = (Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes())
        except OSError as e:
            p.error(f"cannot read the TLS files: {e}")
    return from_flags(
        CoordinatorConfig,
        args,
        server=server_config(args, tls=tls),
        engine=engine,
        ray_join=args.ray_join or None,
        draft_auth_token=args.draft_auth_token or None,
    )


def server_config(args: argparse.Namespace, **more) -> ServerConfig:
    """The `ServerConfig` of the parsed flags (--http-port 0 is `http_port` None: no HTTP API),
    with `more` fields."""
    return from_flags(
        ServerConfig, args, http_port=args.http_port or None, api_key=getattr(args, "api_key", None) or None, **more
    )


def engine_config(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> EngineConfig:
    """The `EngineConfig` of the parsed flags, --chat-template read; `error` (a parser's) refuses a
    default k above the largest a request may ask for."""
    if args.default_draft_tokens > args.max_draft_tokens:
        error(f"--default-draft-tokens {args.default_draft_tokens} exceeds --max-draft-tokens {args.max_draft_tokens}")
    chat_template = None
    if args.chat_template:
        try:
            chat_template = Path(args.chat_template).read_text()
        except (OSError, UnicodeDecodeError) as e:
            error(f"--chat-template: cannot read {args.chat_template}: {e}")
    return from_flags(EngineConfig, args, chat_template=chat_template)


async def serve(config: CoordinatorConfig, node_ended: Callable[[], bool] = lambda: False) -> int:
    """Serve until SIGTERM or SIGINT (0), or until the Ray node this process joined ends (1, so
    that the pod restarts and joins the cluster anew), then stop: NOT_SERVING, calls in flight
    get the grace period."""
    from specdec.coordinator.clients import DraftClient, DraftClientConfig
    from specdec.coordinator.remote import connect_engine
    from specdec.coordinator.server import GenerationServer
    from specdec.target_service.pool import PoolConfig
    from specdec.telemetry.metrics import MetricsServer

    pool = await _first_pool(PoolConfig(prefix=config.target_pool, namespace=config.namespace), config, node_ended)
    draft_addresses = config.draft.split(",") if "," in config.draft else config.draft
    async with DraftClient(draft_addresses, DraftClientConfig(auth_token=config.draft_auth_token)) as draft:
        engine = await connect_engine(draft, pool, config.target_model, config.engine)
        server = GenerationServer(engine, config.server)
        port = await server.start()
        metrics = MetricsServer(config.server.host, config.metrics_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        tls = " (TLS)" if config.server.tls else ""
        actors = f"{len(pool.actors)} actor{'s' if len(pool.actors) != 1 else ''}"
        print(
            f"coordinator listening on {config.server.host}:{port}{tls} | draft {config.draft} | "
            f"target pool {config.target_pool} ({actors}, {engine.target.name})",
            flush=True,
        )
        if server.http is not None:
            print(f"coordinator HTTP API (OpenAI-compatible) on {config.server.host}:{server.http_port}", flush=True)
        print(f"coordinator metrics on {metrics.address}", flush=True)
        # Health follows the target tier: NOT_SERVING while no actor of the pool answers.
        watch = loop.create_task(server.follow(pool.reachable, config.pool_check_s))
        stopped, ended = loop.create_task(stop.wait()), loop.create_task(_until(node_ended))
        try:
            await asyncio.wait([stopped, ended], return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            lost = ended.done()
            if lost:
                print(
                    "specdec coordinator: the Ray node this process joined has ended (the head restarted or is "
                    "gone): stopping, to be restarted and join the cluster anew",
                    file=sys.stderr,
                    flush=True,
                )
            stopped.cancel()
            ended.cancel()
            await server.stop()
            metrics.close()
        return 1 if lost else 0


async def _first_pool(pool_config, config: CoordinatorConfig, node_ended: Callable[[], bool]):
    """The target pool once it has an actor, waited for up to `config.pool_wait_s` (while the Ray
    node this process joined lives): raises `TargetUnavailable` after that."""
    from specdec.target_service.pool import TargetPool, TargetUnavailable

    deadline = time.monotonic() + config.pool_wait_s
    while True:
        try:
            return await asyncio.to_thread(TargetPool, pool_config)
        except TargetUnavailable as e:
            if time.monotonic() >= deadline or node_ended():
                raise
            log.info("%s: waiting (up to %.0f s in all)", e, config.pool_wait_s)
            await asyncio.sleep(1.0)


async def _until(condition: Callable[[], bool], every_s: float = 1.0) -> None:
    while not condition():
        await asyncio.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(sys.argv[1:] if argv is None else argv)
    from specdec.target_service.pool import TargetUnavailable
    from specdec.target_service.ray_cluster import RayNode, connect
    from specdec.telemetry.tracing import configure_tracing

    configure_tracing("specdec-coordinator")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    node = RayNode(config.ray_join, config.namespace) if config.ray_join else None
    try:
        if node is not None:
            node.__enter__()
        else:
            connect(config.ray_address, config.namespace)
    except (RuntimeError, ConnectionError) as e:
        print(f"specdec coordinator: cannot join the Ray cluster: {e}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(serve(config, node.ended if node is not None else lambda: False))
    except TargetUnavailable as e:
        print(f"specdec coordinator: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError, RuntimeError) as e:  # the tokenizer the pool names is not here; a busy port
        print(
            f"specdec coordinator: {type(e).__name__}: {e} (--target-model names where to load the tokenizer from)",
            file=sys.stderr,
        )
        return 1
    finally:
        if node is not None:
            node.leave()  # the node goes with the process (and the process, if cut off for good)


if __name__ == "__main__":
    sys.exit(main())
