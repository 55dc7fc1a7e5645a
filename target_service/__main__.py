"""`python -m target_service` / `specdec target`: start or resize the target actor pool.

With `--address`, the pool is created (or resized) on that Ray cluster as detached, named actors
and the command returns: they live on in the cluster and coordinators find them by name. With
`--keep SECONDS` as well, it stays and keeps the pool at its size, checking that often: missing
actors (after a head restart, all of them) are created again, extra ones drained then removed;
it exits with an error when the cluster cannot be reached, for its supervisor to restart it.
With `--ray-join` instead of `--address`, the process joins the cluster as a Ray node of its own
(no Ray Client, no client server on the head); with `--keep` it exits 1 as soon as that node is
cut off (a head restarted without GCS fault tolerance starts a new cluster), for its supervisor
to restart it into the new one.
With `--autoscale on` and `--keep`, the pool's size follows its load (KV use and queued rounds per
actor) between --min-replicas and --max-replicas (target_service/autoscale.py), starting from the
pool it finds (or --replicas).
With no address, a local Ray is started for the pool, and the command stays in the foreground
(the local cluster ends with it) until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

from specdec.cli.config_flags import add_flags, from_flags
from specdec.core.settings import setting
from specdec.target_service.actor import ActorConfig
from specdec.target_service.autoscale import AutoscaleConfig, Autoscaler
from specdec.target_service.pool import NAMESPACE, PREFIX, actor_names, keep, launch


@dataclass(frozen=True)
class PoolCommand:
    """What `specdec target` is told besides the actors' `ActorConfig`."""

    replicas: int = setting(1, "actors in the pool (a GPU each when there are GPUs)")
    address: str | None = setting(None, "Ray cluster address (default: start a local Ray)")
    ray_join: str | None = setting(
        None,
        "GCS address of the Ray cluster to join as a node of this process's own (no CPUs or GPUs), "
        "instead of a Ray Client through the head's client server; replaces --address",
        type="gcs_address",
        metavar="HOST:PORT",
    )
    namespace: str = setting(NAMESPACE, "Ray namespace of the pool")
    name: str = setting(PREFIX, "actor name prefix: actors are <name>-0 .. <name>-(n-1)")
    num_cpus: int | None = setting(None, "CPUs of the local Ray (default: all)", type=int)
    cpus_per_actor: int | None = setting(  # ActorConfig.cpus, once known
        None,
        "on CPU nodes: CPUs (and torch threads) per actor (default: a local Ray's CPUs shared out, 1 on a cluster)",
        type=int,
    )
    keep: float = setting(
        0.0,
        "with --address: stay, and every this many seconds recreate missing actors and drain extra ones "
        "(0: create or resize once and return)",
        type="seconds",
    )
    drain_timeout: float = setting(
        60.0,
        "seconds an actor being removed gets to finish its queued rounds (its sessions move at once)",
        type="seconds",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdec target", description=__doc__.splitlines()[0])
    add_flags(p, PoolCommand)
    add_flags(p, AutoscaleConfig)
    add_flags(p, ActorConfig)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("replicas", "max_batch", "max_sessions", "max_cached_tokens", "max_queue", "max_pass_tokens"):
        if getattr(args, name) < 1:
            print(f"specdec target: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if args.ray_join and args.address:
        print("specdec target: --ray-join replaces --address: give one of them", file=sys.stderr)
        return 2
    from specdec.runtime.loading import prepare
    from specdec.runtime.models import UnservableModel
    from specdec.target_service.ray_cluster import RayNode, connect

    try:
        prepare(args.target_model)  # a model that cannot be served is refused before any actor starts
    except UnservableModel as e:
        print(f"specdec target: {e}", file=sys.stderr)
        return 2

    if not args.ray_join:
        connect(args.address, args.namespace, num_cpus=args.num_cpus)
        return _run(args, config_from(args), on_cluster=bool(args.address))
    node = RayNode(args.ray_join, args.namespace)
    try:
        node.__enter__()
    except (RuntimeError, ConnectionError) as e:
        print(f"specdec target: cannot join the Ray cluster: {e}", file=sys.stderr)
        return 1
    threading.Thread(target=_exit_when_cut_off, args=(node,), daemon=True).start()
    code = 1
    try:
        code = _run(args, config_from(args), on_cluster=True)
        return code
    finally:
        node.leave(wait_s=5.0 if code else 0.0, why=_CUT_OFF)  # the node goes with the process


def config_from(args: argparse.Namespace) -> ActorConfig:
    return from_flags(ActorConfig, args)


_CUT_OFF = (
    "specdec target: the Ray node this process joined has ended (the head restarted or is gone): "
    "exiting, to be restarted and join the cluster anew"
)


def _exit_when_cut_off(node, every_s: float = 1.0) -> None:
    """Exit 1 once the Ray node this process joined is cut off for good (its head restarted as a
    new cluster, or it exited): whatever the main thread waits on there never answers, and the
    supervisor's restart joins the new cluster, where the pool is then created again."""
    while not node.ended():
        time.sleep(every_s)
    node.leave(why=_CUT_OFF)


def _run(args: argparse.Namespace, config: ActorConfig, on_cluster: bool) -> int:
    cpus = args.cpus_per_actor
    if cpus is None:
        import ray

        cpus = 1 if on_cluster else max(1, int(ray.cluster_resources().get("CPU", 1)) // args.replicas)
    if cpus < 1:
        print("specdec target: --cpus-per-actor must be >= 1", file=sys.stderr)
        return 2
    if args.gpus_per_actor is not None and args.gpus_per_actor < 0:
        print("specdec target: --gpus-per-actor must be >= 0", file=sys.stderr)
        return 2
    config = replace(config, cpus=cpus, gpus=args.gpus_per_actor)
    scaling = from_flags(AutoscaleConfig, args)
    autoscaler, replicas = None, args.replicas
    if scaling.autoscale:
        if not (on_cluster and args.keep):
            print("specdec target: --autoscale on needs a cluster and --keep", file=sys.stderr)
            return 2
        if scaling.problems():
            print(f"specdec target: {'; '.join(scaling.problems())}", file=sys.stderr)
            return 2
        # A restarted keeper goes on from the pool it finds, not back to --replicas.
        autoscaler = Autoscaler(scaling, len(actor_names(args.name, args.namespace)) or args.replicas)
        replicas = autoscaler.desired
    names = launch(config, replicas, prefix=args.name, namespace=args.namespace, drain_s=args.drain_timeout)
    print(f"target pool {args.name} in namespace {args.namespace}: {', '.join(names)}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if on_cluster and args.keep:
        if autoscaler is None:
            print(f"keeping the pool at {replicas} actors (checked every {args.keep:g} s)", flush=True)
        else:
            print(
                f"keeping the pool at {scaling.min_replicas}..{scaling.max_replicas} actors by its load, "
                f"now {replicas} (checked every {args.keep:g} s)",
                flush=True,
            )
        try:
            keep(config, replicas, args.name, args.namespace, args.keep, stop, args.drain_timeout, autoscaler)
        except Exception as e:  # noqa: BLE001 - the cluster is gone: exit for the supervisor to restart us
            print(f"specdec target: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        return 0
    if on_cluster:
        return 0
    print("local Ray: serving until Ctrl-C", flush=True)
    stop.wait()
    import ray

    for name in actor_names(args.name, args.namespace):
        ray.kill(ray.get_actor(name, namespace=args.namespace), no_restart=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
