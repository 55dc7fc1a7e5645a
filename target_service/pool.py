"""The pool the coordinator calls: the Verifier interface over named Ray target actors.

Sessions stick to one actor while they live (its KV cache is there); a new session goes to the
least loaded actor as the actors themselves report it (queued and running rounds, KV blocks in
use: `TargetActor.load`, polled every `load_poll_s`), so every coordinator sees the same view,
plus the sessions this pool placed since the last poll. When an actor dies or restarts, its
sessions get `miss` (or a Ray actor error), and the pool resends the full context from the
coordinator's token list — to the restarted actor, or to another one if it stays down — so
output never changes. A round that waits longer than `verify_timeout_s` (a stalled actor) moves
its session to another actor at once; an actor whose queue is full answers `overloaded` and the
session is placed on another one, and with every actor full the call fails with
`TargetOverloaded` (RESOURCE_EXHAUSTED at the API). Actors are found by name (`<prefix>-<i>` in
a namespace), so any coordinator can attach to a running pool and a resize is picked up on the
next refresh.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import ray
from opentelemetry.propagate import inject
from ray.actor import ActorHandle

from specdec.core.acceptance import DraftProposal, Verification
from specdec.core.sampling import SamplingParams
from specdec.target_service.actor import ActorConfig, remote_actor_class
from specdec.target_service.autoscale import Autoscaler, signals_from
from specdec.target_service.protocol import VerifyRequest

log = logging.getLogger(__name__)

NAMESPACE = "specdec"
PREFIX = "specdec-target"
_ACTOR_ERRORS = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


class TargetUnavailable(RuntimeError):
    """No actor could verify the round within the retry budget."""


class TargetOverloaded(RuntimeError):
    """Every actor's queue is full: the caller should back off (RESOURCE_EXHAUSTED)."""


@dataclass(frozen=True)
class PoolConfig:
    prefix: str = PREFIX  # actors are named <prefix>-0 .. <prefix>-(n-1)
    namespace: str = NAMESPACE
    attempts: int = 40  # tries per round across restarts and re-placements
    backoff_s: float = 0.25  # wait between tries while an actor restarts
    moves_after: int = 4  # consecutive failures on one actor before its sessions move
    refresh_s: float = 10.0  # how often to look for added or removed actors
    verify_timeout_s: float = 60.0  # a round unanswered this long moves its session to another actor
    load_poll_s: float = 1.0  # how often to read the actors' own load for placing new sessions
    lookup_timeout_s: float = 5.0  # a lookup of the actors by name slower than this keeps the handles we have


@dataclass
class _Placement:
    actor: str  # actor name
    held: int = 0  # tokens the actor holds for the session, as far as the pool knows
    failures: int = 0


class TargetPool:
    def __init__(self, config: PoolConfig = PoolConfig()):
        self.config = config
        self.actors: dict[str, ActorHandle] = {}
        self.sessions: dict[str, _Placement] = {}
        self.resends = 0  # full-context resends after a miss or an actor failure
        # A round whose caller was cancelled still runs on its actor, and a first round creates the
        # session there: end_session waits for it, or the session would outlive the request.
        self._abandoned: dict[str, ray.ObjectRef] = {}
        self._refreshed = 0.0
        self._load: dict[str, float] = {}  # actor -> load as it last reported it
        self._placed_since_poll: dict[str, int] = {}
        self._polled = 0.0
        self._poll: asyncio.Task | None = None
        self._lookup: asyncio.Future | None = None
        self.refresh()
        if not self.actors:
            raise self._no_actors()

    def refresh(self) -> None:
        names = actor_names(self.config.prefix, self.config.namespace)
        self.actors = {
            name: self.actors.get(name) or ray.get_actor(name, namespace=self.config.namespace) for name in names
        }
        self._refreshed = time.monotonic()

    def _no_actors(self) -> TargetUnavailable:
        return TargetUnavailable(f"no target actors named {self.config.prefix}-N in namespace {self.config.namespace}")

    async def info(self) -> dict:
        if not self.actors:
            raise self._no_actors()
        return await next(iter(self.actors.values())).info.remote()

    async def _look_up(self, force: bool = False) -> None:
        """Look the actors up by name again when the last lookup is older than refresh_s (or now,
        with `force`): off the event loop, one lookup at a time, bounded by lookup_timeout_s. The
        lookup asks the head; while the head is down it blocks, but the actors still answer the
        handles we hold (calls go to them directly), so a failed lookup keeps those."""
        if not force and time.monotonic() - self._refreshed <= self.config.refresh_s:
            return
        if self._lookup is None:
            self._lookup = asyncio.ensure_future(
                asyncio.wait_for(asyncio.to_thread(self.refresh), self.config.lookup_timeout_s)
            )
            # Read even when every caller has gone (cancelled): never an unretrieved exception.
            self._lookup.add_done_callback(lambda f: f.cancelled() or f.exception())
        lookup = self._lookup
        try:
            await asyncio.shield(lookup)  # a cancelled caller leaves the lookup to the others
        except Exception as error:  # noqa: BLE001 - the head unreachable: keep what we have
            log.warning("looking up the target actors failed (%s): keeping %d handles", error, len(self.actors))
            self._refreshed = time.monotonic()
        finally:
            if self._lookup is lookup and lookup.done():
                self._lookup = None

    async def reachable(self, timeout_s: float = 2.0) -> bool:
        """Whether any actor of the pool answers within `timeout_s` (the actors are looked up
        again first: after a head restart the old handles name actors that are gone)."""
        await self._look_up(force=True)
        if not self.actors:
            return False
        done, pending = await asyncio.wait(
            [asyncio.ensure_future(_future(actor.load.remote())) for actor in self.actors.values()], timeout=timeout_s
        )
        for future in pending:
            future.cancel()
        return any(not isinstance(future.result(), _Failed) for future in done)

    async def verify(
        self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams
    ) -> Verification:
        tokens = list(tokens)
        carrier: dict[str, str] = {}
        inject(carrier)  # the round's span continues inside the actor
        if session_id not in self.sessions:
            await self._poll_load()
        full: set[str] = set()  # actors that answered `overloaded` to this round
        for _ in range(self.config.attempts):
            await self._look_up(force=not self.actors)  # a pool that lost every actor may have new ones
            placement = self._placement(session_id)
            request = VerifyRequest(
                session_id,
                placement.held,
                tokens[placement.held :],
                list(proposal.token_ids),
                proposal.draft_probs,
                sampling,
                carrier,
                proposal.parents,
            )
            ref = self.actors[placement.actor].verify.remote(request)
            answer = asyncio.ensure_future(_future(ref))
            try:
                # asyncio.wait, not wait_for: Python 3.11's wait_for returns a result that lands
                # with a cancellation and swallows the cancellation, so a cancelled request
                # would go on generating.
                done, _ = await asyncio.wait({answer}, timeout=self.config.verify_timeout_s)
            except asyncio.CancelledError:
                self._abandoned[session_id] = ref
                raise
            if not done:  # a stalled actor: the session moves, its context goes with it
                ray.cancel(ref)
                self._move(session_id, placement.actor)
                continue
            reply = answer.result()
            if isinstance(reply, _Failed):
                if not isinstance(reply.error, _ACTOR_ERRORS):
                    raise reply.error
                self._failed(session_id, placement)
                await asyncio.sleep(self.config.backoff_s)
                continue
            if reply.error:
                raise ValueError(reply.error)
            if reply.overloaded:
                full.add(placement.actor)
                if full >= set(self.actors):
                    self.sessions.pop(session_id, None)
                    raise TargetOverloaded(f"all {len(self.actors)} target actors have full queues")
                self._move(session_id, placement.actor, avoid=full)
                continue
            if reply.miss:
                placement.held = 0
                self.resends += 1
                continue
            placement.held, placement.failures = reply.held, 0
            return reply.verification
        raise TargetUnavailable(f"session {session_id}: no target actor answered after {self.config.attempts} tries")

    async def end_session(self, session_id: str) -> None:
        abandoned = self._abandoned.pop(session_id, None)
        if abandoned is not None:
            await asyncio.gather(abandoned, return_exceptions=True)
        placement = self.sessions.pop(session_id, None)
        if placement is not None and placement.actor in self.actors:
            try:
                await self.actors[placement.actor].end_session.remote(session_id)
            except _ACTOR_ERRORS:
                pass  # a dead actor holds nothing; its TTL would have freed it anyway

    def _placement(self, session_id: str) -> _Placement:
        placement = self.sessions.get(session_id)
        if placement is None or placement.actor not in self.actors:
            placement = self.sessions[session_id] = _Placement(self._least_loaded())
        return placement

    def _least_loaded(self, avoid: set[str] = frozenset()) -> str:
        """The actor with the least reported load plus what this pool placed since the report;
        ties broken at random, so coordinators starting together do not all pick actor 0."""
        if not self.actors:
            raise self._no_actors()
        names = [name for name in self.actors if name not in avoid] or list(self.actors)

        def load(name: str) -> float:
            return self._load.get(name, 0.0) + self._placed_since_poll.get(name, 0)

        least = min(load(name) for name in names)
        chosen = random.choice([name for name in names if load(name) == least])
        self._placed_since_poll[chosen] = self._placed_since_poll.get(chosen, 0) + 1
        return chosen

    def _move(self, session_id: str, actor: str, avoid: set[str] = frozenset()) -> None:
        """Place the session on another actor now (it resends its context there)."""
        self.resends += 1
        self.sessions[session_id] = _Placement(self._least_loaded(avoid={actor, *avoid}))

    async def _poll_load(self) -> None:
        """Before placing a session: read the actors' load when the last reading is older than
        load_poll_s; waits for the very first reading only, later ones run in the background."""
        if self._poll is None and time.monotonic() - self._polled > self.config.load_poll_s:
            self._poll = asyncio.get_running_loop().create_task(self._read_load())
        if self._polled == 0.0 and self._poll is not None:
            await asyncio.shield(self._poll)

    async def _read_load(self) -> None:
        try:
            names = list(self.actors)
            loads = await asyncio.wait_for(
                asyncio.gather(*(self.actors[n].load.remote() for n in names), return_exceptions=True),
                self.config.verify_timeout_s,
            )
            self._load = {name: _load_score(load) for name, load in zip(names, loads) if isinstance(load, dict)}
            self._placed_since_poll = {}
        except TimeoutError:
            pass
        finally:
            self._polled = time.monotonic()
            self._poll = None

    def _failed(self, session_id: str, placement: _Placement) -> None:
        placement.held = 0  # whatever comes back up has lost the cache
        placement.failures += 1
        self.resends += 1
        if placement.failures >= self.config.moves_after and len(self.actors) > 1:
            self.sessions[session_id] = _Placement(self._least_loaded(avoid={placement.actor}))


def _load_score(load: dict) -> float:
    """One number per actor: sessions held, rounds waiting, plus the share of KV blocks in use
    (so an actor whose pool is filling loses ties, and then more)."""
    if load.get("draining"):
        return math.inf  # on its way out: never a new session's first choice
    blocks = load["kv_blocks_used"] / max(1, load["kv_blocks_total"])
    return load["sessions"] + load["queued"] + 8 * blocks


async def _future(ref: ray.ObjectRef):
    """The reply, or the actor's failure as a value, so an answer nobody awaits any more (its
    caller was cancelled or moved on) is never an unretrieved exception."""
    try:
        return await ref
    except Exception as error:  # noqa: BLE001 - re-raised by whoever reads the result
        return _Failed(error)


@dataclass
class _Failed:
    error: Exception


def actor_names(prefix: str, namespace: str) -> list[str]:
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)$")
    found = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace and pattern.match(a["name"])
    ]
    return sorted(found, key=lambda name: int(pattern.match(name).group(1)))


def launch(
    config: ActorConfig, replicas: int, prefix: str = PREFIX, namespace: str = NAMESPACE, drain_s: float = 60.0
) -> list[str]:
    """Create or resize the pool to `replicas` named actors; returns their names once all are up.

    Existing actors are kept (their caches too); extra ones beyond `replicas` are drained, then
    killed (`drain`). Actors are detached: they outlive this call (and its process), owned by the
    cluster, not by us.
    """
    import torch

    # The launching process (a Job pod, a laptop) may have no GPU where the actors will: ask the cluster.
    gpus = config.gpus
    if gpus is None:
        gpus = 1 if torch.cuda.is_available() or ray.cluster_resources().get("GPU", 0) >= 1 else 0
    cls = remote_actor_class(num_gpus=gpus, num_cpus=config.cpus)
    options = {"namespace": namespace, "get_if_exists": True, "lifetime": "detached"}
    # The OTEL_* settings of the process that creates the pool travel with the actors, wherever
    # Ray places them (a worker pod's own environment is used for what is not set here).
    otel = {key: value for key, value in os.environ.items() if key.startswith("OTEL_")}
    if otel:
        options["runtime_env"] = {"env_vars": otel}
    handles = [cls.options(name=f"{prefix}-{i}", **options).remote(config) for i in range(replicas)]
    ray.get([h.info.remote() for h in handles])  # raises here if a model fails to load
    extra = [ray.get_actor(name, namespace=namespace) for name in actor_names(prefix, namespace)[replicas:]]
    drain(extra, drain_s)
    return [f"{prefix}-{i}" for i in range(replicas)]


def drain(actors: list[ActorHandle], timeout_s: float) -> None:
    """Remove `actors` without failing a round: each stops taking rounds (its sessions move to the
    other actors on their next round, with their context) and is killed once the rounds it had
    queued are done, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    busy = [a for a in actors if _busy(a, "drain")]
    while busy and time.monotonic() < deadline:
        time.sleep(0.1)
        busy = [a for a in busy if _busy(a, "load")]
    for actor in actors:
        ray.kill(actor, no_restart=True)


def _busy(actor: ActorHandle, method: str) -> bool:
    """Whether the actor still has rounds queued or running (a dead one has none)."""
    try:
        load = ray.get(getattr(actor, method).remote(), timeout=30)
    except (*_ACTOR_ERRORS, ray.exceptions.GetTimeoutError):
        return False
    return bool(load["queued"] or load["running"])


def _loads(names: list[str], namespace: str, timeout_s: float = 5.0) -> list[dict]:
    """The `load()` of each named actor that answers within `timeout_s` (a dead or stalled one
    says nothing: the pool's size follows the actors that serve)."""
    refs = []
    for name in names:
        try:
            refs.append(ray.get_actor(name, namespace=namespace).load.remote())
        except ValueError:  # gone since it was listed
            continue
    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    loads = []
    for ref in ready:
        try:
            loads.append(ray.get(ref))
        except _ACTOR_ERRORS:
            continue
    return loads


def keep(
    config: ActorConfig,
    replicas: int,
    prefix: str = PREFIX,
    namespace: str = NAMESPACE,
    every_s: float = 10.0,
    stop: threading.Event | None = None,
    drain_s: float = 60.0,
    autoscaler: Autoscaler | None = None,
) -> None:
    """Keep the pool at `replicas` actors until `stop` is set: every `every_s`, create the actors
    that are missing (after a head restart, all of them) and drain the extra ones. With an
    `autoscaler`, the size is the one it asks for from the actors' load, read at each check. An
    error (the head unreachable) propagates: the keeper's process exits and its supervisor
    restarts it."""
    stop = stop or threading.Event()
    while True:
        names = actor_names(prefix, namespace)
        if autoscaler is not None:
            wanted = autoscaler.observe(time.monotonic(), signals_from(_loads(names, namespace)))
            if wanted != replicas:
                log.warning("target pool %s: its load asks for %d actors, not %d", prefix, wanted, replicas)
                replicas = wanted
        if names != [f"{prefix}-{i}" for i in range(replicas)]:
            log.warning("target pool %s: %d actors, want %d: reconciling", prefix, len(names), replicas)
            launch(config, replicas, prefix, namespace, drain_s)
        if stop.wait(every_s):
            return
