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

from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.flags import HTTP_PORT, add_engine_flags, add_http_flags, engine_config, server_config
from specdec.coordinator.server import ServerConfig
from specdec.core import flag_types

log = logging.getLogger(__name__)

ENV_PREFIX = "SPECDEC_COORDINATOR_"
METRICS_PORT = 9464


@dataclass(frozen=True)
class CoordinatorConfig:
    draft: str  # DraftService address(es)
    target_pool: str  # actor name prefix of the target pool
    namespace: str
    ray_address: str  # "auto": the Ray cluster of this machine
    ray_join: str | None  # GCS address: join as a Ray node of our own and run as a driver there
    target_model: str | None  # tokenizer spec; None: the model the pool reports
    metrics_port: int  # Prometheus /metrics on --host; 0 picks a free port
    server: ServerConfig
    engine: EngineConfig
    draft_auth_token: str | None = field(default=None, repr=False)  # sent as 'authorization: Bearer <token>'
    pool_check_s: float = 2.0  # how often health checks that an actor of the pool answers
    pool_wait_s: float = 0.0  # how long to wait at start for the pool's first actor


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    from specdec.target_service.pool import NAMESPACE, PREFIX

    server = ServerConfig()
    p = argparse.ArgumentParser(
        prog="specdec coordinator",
        description="Serve specdec.v1.GenerationService over a draft tier and a target pool. "
        f"Each flag may also be set by {ENV_PREFIX}<FLAG>.",
    )

    def flag(
        name: str, default, type, help: str, metavar: str | None = None, required: bool = False, secret: bool = False
    ) -> None:
        env = ENV_PREFIX + name.upper().replace("-", "_")
        # argparse runs `type` on string defaults, so an environment value is checked like a flag.
        default = environ.get(env, default)
        shown = ("set" if default else "unset") if secret else default  # --help never prints a token
        p.add_argument(
            f"--{name}",
            default=default,
            type=type,
            metavar=metavar,
            required=required and default is None,
            help=f"{help} [env {env}; default {shown}]",
        )

    flag(
        "draft",
        None,
        str,
        "DraftService address: host:port, several comma-separated, or dns:///name:port",
        required=True,
    )
    flag("target-pool", PREFIX, str, "target actor name prefix (actors <name>-0 .. <name>-(n-1))")
    flag("namespace", NAMESPACE, str, "Ray namespace of the target pool")
    flag("ray-address", "auto", str, "Ray cluster to join ('auto': the one running on this machine)")
    flag(
        "ray-join",
        None,
        flag_types.gcs_address,
        "GCS address (HOST:PORT) of the Ray cluster to join as a node of this process's own, with no CPUs "
        "or GPUs, running as a driver on it: verify calls then go to the actors directly, never through "
        "the head (Ray's ports must be open between this host and the cluster's); replaces --ray-address",
        metavar="HOST:PORT",
    )
    flag(
        "pool-wait",
        0.0,
        flag_types.seconds,
        "seconds to wait at start for the target pool's first actor (pods start in any order, and a "
        "restarted Ray head has no actors until the keeper recreates them); 0: fail at once",
    )
    flag("target-model", None, str, "model spec to load the tokenizer from (default: the model the pool reports)")
    flag("host", server.host, str, "address to bind")
    flag("port", server.port, flag_types.port, "port to bind; 0 picks a free one (printed at start)")
    add_http_flags(flag, HTTP_PORT)
    flag("metrics-port", METRICS_PORT, flag_types.port, "Prometheus metrics port (on --host); 0 picks a free one")
    add_engine_flags(flag)
    flag("grace", server.grace_s, flag_types.seconds, "seconds calls in flight get to finish after SIGTERM")
    flag("tls-cert", None, str, "PEM certificate chain file: serve TLS (with --tls-key) instead of plaintext")
    flag("tls-key", None, str, "PEM private key file of --tls-cert")
    flag(
        "api-key",
        None,
        str,
        "clients of both APIs must send 'authorization: Bearer <key>' (health exempt); "
        "prefer the env variable: flags show in ps",
        secret=True,
    )
    flag(
        "draft-auth-token",
        None,
        str,
        "token the draft tier requires (its --auth-token); prefer the env variable: flags show in ps",
        secret=True,
    )
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
    return CoordinatorConfig(
        draft=args.draft,
        target_pool=args.target_pool,
        namespace=args.namespace,
        ray_address=args.ray_address,
        ray_join=args.ray_join or None,
        target_model=args.target_model,
        metrics_port=args.metrics_port,
        server=server_config(args, grace_s=args.grace, tls=tls),
        engine=engine,
        draft_auth_token=args.draft_auth_token or None,
        pool_wait_s=args.pool_wait,
    )


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
