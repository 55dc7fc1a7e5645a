"""The Ray actor around the engine: continuous batching of queued verify calls.

The actor owns the queue, the worker loop that feeds the engine, the look-ahead
(`lookahead.py`), and what a call sees: replies, spans, metrics. It decides nothing about a pass:
admission, the token budget, chunking, pinning and preemption are the scheduler's
(`scheduler.py`), the forward and the acceptance rule the verifier's (`verifier.py`).

Ray delivers concurrent `verify` calls to this async actor; each waits on a future while one
worker task runs the engine whenever the model is free: one pass (`TargetVerifier.step`, in a
thread, so the event loop keeps accepting calls meanwhile) over the oldest `max_batch` queued
rounds, each admitted (`Scheduler.admit`) when it first reaches the engine; a round the pass did
not finish (a prefill chunk went in, or its blocks were short) goes back to the head of the
queue, so no round is overtaken by later ones. Before a pass the worker gathers: it waits a
bounded time for the sessions the last pass answered to send their next rounds, since a round
that misses a pass waits a whole pass. The queue is bounded: beyond `max_queue` a round is
answered `overloaded` at once and the pool places the session on another actor. A round that is
bad in itself fails alone, and a pass that fails fails its rounds, never the worker. A restarted
actor has lost its caches: every session then answers `miss` once and is re-prefilled by the pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import ray
import torch
from opentelemetry import trace
from opentelemetry.propagate import extract

from specdec.core.acceptance import DraftProposal
from specdec.core.session_store import SessionStore
from specdec.core.settings import setting
from specdec.runtime.compiled import COMPILE_MODES
from specdec.runtime.loading import load_model
from specdec.runtime.paged_decoder import decoder_name
from specdec.target_service import metrics
from specdec.target_service.lookahead import Ahead, plain
from specdec.target_service.protocol import VerifyReply, VerifyRequest
from specdec.target_service.ray_cluster import watch_cluster
from specdec.target_service.scheduler import DEFAULT_PASS_TOKENS, ItemRejected, VerifyItem, cached_tokens
from specdec.target_service.verifier import TargetVerifier
from specdec.telemetry.metrics import MetricsServer
from specdec.telemetry.tracing import configure_tracing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorConfig:
    target_model: str | None = setting(  # load_model spec
        None, "local dir, .gguf file or hub id (default: embedded Gemma 3 270M)"
    )
    max_batch: int = setting(32, "rounds verified in one forward pass at most")
    max_queue: int = setting(256, "rounds an actor queues; more are answered `overloaded` and placed elsewhere")
    kv_cache_bytes: int | None = setting(
        None,
        "each actor's KV block pool, e.g. 4GiB (default: 90% of free GPU memory, a quarter of free RAM)",
        type="byte_size",
    )
    max_pass_tokens: int = setting(
        DEFAULT_PASS_TOKENS, "new tokens one forward pass takes; longer prefills go in chunks"
    )
    compile: str = setting(
        "off",
        "decode-shaped passes through torch.compile: inductor, or cudagraphs (inductor with CUDA graphs; "
        "GPU actors only); compiled when an actor starts",
        choices=COMPILE_MODES,
    )
    # Before a pass, the worker waits for the sessions answered by the last pass to send their
    # next rounds (each coordinator answers its streams one after another, so under load the last
    # comes well after the first), at most `gather_fraction` of the last pass's time and never
    # past `gather_s`: a round that misses a pass waits a whole pass, so waiting a fraction of one
    # for it is cheaper, and the cores serve the coordinator meanwhile.
    gather_s: float = 0.2
    gather_fraction: float = 0.5
    lookahead: bool = True  # decode a round ahead for sessions without drafts (target_service/lookahead.py)
    max_sessions: int = setting(256, "cached sessions per actor (LRU beyond)")
    max_cached_tokens: int = setting(262_144, "summed cached positions per actor (LRU beyond)")
    # A coordinator that died never ends its sessions.
    session_ttl_s: float = setting(600.0, "seconds an idle session is kept")
    half_precision: bool = setting(  # bf16 weights when on a GPU
        True, "fp32 on GPUs too (CPU is always fp32)", flag="full-precision", action="store_false"
    )
    metrics_host: str = setting("127.0.0.1", "address each actor serves Prometheus metrics on (0.0.0.0 in a cluster)")
    metrics_port: int = setting(  # actors sharing a node count up
        9466, "each actor's metrics port: the first free one from here on; 0 picks any", type="port"
    )
    gpus: float | None = setting(
        None,
        "GPUs Ray reserves per actor (default: 1 when the cluster, or this machine, has GPUs, else 0)",
        flag="gpus-per-actor",
        type=float,
    )
    cpus: int = 1  # on a CPU node: the CPUs Ray reserves for the actor and the torch threads it runs
    trace_in_memory: bool = False  # keep finished spans for `finished_spans` (tests)
    trace_file: str | None = None  # also append finished spans here as JSON lines (`specdec up`)


class TargetActor:
    def __init__(self, config: ActorConfig):
        self.config = config
        self._spans = configure_tracing("specdec-target", memory=config.trace_in_memory, file=config.trace_file)
        threads = self._load(config)
        self._queue: list[_Round] = []
        self._running = 0  # rounds in the pass now running
        # Every pass runs on this one thread: torch's OpenMP team belongs to the thread that
        # starts it, so passes on changing threads would keep several teams on the same cores.
        self._pass_thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="specdec-pass", initializer=torch.set_num_threads, initargs=(threads,)
        )
        # Sessions the last pass answered that have not sent their next round (nor ended), and
        # how long that pass took: what the worker gathers for (`_gather`).
        self._expected: set[str] = set()
        self._last_pass_s = 0.0
        self._ahead: dict[str, Ahead] = {}  # session -> the round run ahead for it
        self._plain: dict[str, int] = {}  # session -> its rounds in a row without drafts (capped)
        self._batch: list[_Round] = []  # the rounds of the pass now running
        self._ending: set[str] = set()  # sessions ended while a pass holds them: ended after it
        self._pass_over: asyncio.Future | None = None  # resolved once the running pass is over
        self.lookahead_hits = 0  # rounds answered by a round run ahead of them
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        # The latest forward passes' batch sizes (for tests and benchmarks), bounded.
        self.batch_sizes: deque[int] = deque(maxlen=10_000)
        # High-water marks, taken after every batch and every queued call (the reliability tests
        # check them against the bounds).
        self.peaks = {"sessions": 0, "cached_tokens": 0, "queued": 0, "kv_blocks": 0}
        self.started_at = time.time()
        self._preempted = 0
        self.draining = False  # set by `drain`: every round is answered `overloaded` from then on
        self._serve_metrics(config)
        self._watch_cluster()

    def _load(self, config: ActorConfig) -> int:
        """Load the target and its verifier on this actor's device, and time its passes; returns
        the torch threads every pass runs with."""
        cuda = torch.cuda.is_available()
        # Ray sets OMP_NUM_THREADS to the actor's CPU reservation (1 unless told): without this
        # a CPU target would run its matmuls on one core of however many it holds.
        threads = torch.get_num_threads() if cuda else config.cpus
        torch.set_num_threads(threads)
        dtype = torch.bfloat16 if cuda and config.half_precision else torch.float32
        self.loaded = load_model(config.target_model, dtype=dtype, device="cuda" if cuda else "cpu")
        store = SessionStore(config.max_sessions, config.max_cached_tokens, config.session_ttl_s, size=cached_tokens)
        self.verifier = TargetVerifier(
            self.loaded, store, config.kv_cache_bytes, config.max_pass_tokens, compile_mode=config.compile
        )
        decoder = decoder_name(self.loaded.model)
        metrics.DECODER.info({"decoder": decoder, "model_type": self.loaded.model.config.model_type})
        log.info(
            "target %s (%s) runs on the %s decoder", self.loaded.name, self.loaded.model.config.model_type, decoder
        )
        # Passes timed before any round, for the coordinators' draft-length policy (`info`).
        self.pass_seconds = self.verifier.profile_passes()
        return threads

    def _serve_metrics(self, config: ActorConfig) -> None:
        """Gauges read from the verifier when scraped, and the server that answers scrapes."""
        # Read when scraped: an actor whose coordinator died gets no more calls, and a scrape
        # then expires the sessions by TTL and shows them gone.
        metrics.SESSIONS.set_function(lambda: len(self.verifier.sessions))
        metrics.CACHE_TOKENS.set_function(lambda: self.verifier.sessions.total_tokens)
        metrics.KV_BLOCKS_USED.set_function(lambda: self.verifier.pool.used_blocks)
        metrics.KV_BLOCKS_TOTAL.set(self.verifier.pool.num_blocks)
        metrics.KV_CACHE_USAGE.set_function(
            lambda: self.verifier.pool.used_blocks / max(1, self.verifier.pool.num_blocks)
        )
        metrics.ROUNDS_RUNNING.set_function(lambda: self._running)
        # The first free port from metrics_port on: actors sharing a node count up from it.
        self.metrics = MetricsServer(config.metrics_host, config.metrics_port, search=64)

    def _watch_cluster(self) -> None:
        """A node of a replaced cluster (its head restarted without GCS fault tolerance) serves
        nobody: end it now, so that its pod restarts into the new cluster, where the pool keeper
        recreates this actor (Ray ends it too, but only once its own failure detection notices,
        while the node keeps holding sessions that no coordinator can reach)."""
        self._left = threading.Event()
        if ray.is_initialized():
            watch_cluster(ray.get_runtime_context().gcs_address, _end_node, self._left)

    def info(self) -> dict:
        return {
            "model": self.loaded.name,
            "device": str(next(self.loaded.model.parameters()).device),  # "cpu", "cuda:0", ...
            "vocab_size": self.loaded.vocab_size,
            "max_context": self.loaded.max_context,
            "eos_token_ids": sorted(self.loaded.eos_token_ids),
            "sessions": len(self.verifier.sessions),
            "cached_tokens": self.verifier.sessions.total_tokens,
            "peaks": dict(self.peaks),
            "kv_block_size": self.verifier.pool.block_size,
            "compile": self.config.compile,
            "decoder": decoder_name(self.loaded.model),
            **self.load(),
            "max_sessions": self.config.max_sessions,
            "max_cached_tokens": self.config.max_cached_tokens,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "batch_sizes": list(self.batch_sizes),
            "lookahead_hits": self.lookahead_hits,
            "metrics_address": self.metrics.address,
            "pass_seconds": self.pass_seconds,
            "lookahead": self.config.lookahead,
        }

    def load(self) -> dict:
        """What the pool places sessions by: the same numbers for every coordinator."""
        return {
            "queued": len(self._queue),
            "running": self._running,
            "sessions": len(self.verifier.sessions),
            "kv_blocks_used": self.verifier.pool.used_blocks,
            "kv_blocks_total": self.verifier.pool.num_blocks,
            "preempted": self.verifier.sessions.evicted.pressure,
            "draining": self.draining,
        }

    def drain(self) -> dict:
        """Take no more rounds: each is answered `overloaded`, so the pool moves its session (with
        its context) to another actor; rounds already queued finish. Returns `load()`: the actor
        may go once it shows nothing queued or running."""
        self.draining = True
        return self.load()

    async def verify(self, request: VerifyRequest) -> VerifyReply:
        if self._worker is None:  # the actor's event loop exists only once a call runs
            self._wakeup = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._drain())
        if self.draining or len(self._queue) >= self.config.max_queue:
            metrics.OVERLOADED.inc()
            return VerifyReply(None, overloaded=True)
        ahead = self._ahead.pop(request.session_id, None)
        if ahead is not None:
            if ahead.serves(request):
                reply = await self._answer_ahead(request, ahead)
                if reply is not None:
                    return reply
            else:
                self._drop(ahead)
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Round(request, future))
        self.peaks["queued"] = max(self.peaks["queued"], len(self._queue))
        metrics.QUEUE_DEPTH.set(len(self._queue))
        self._wakeup.set()
        return await future

    async def _answer_ahead(self, request: VerifyRequest, ahead: Ahead) -> VerifyReply | None:
        """The reply of the round run ahead for `request` (waiting for its pass), or None when
        that round failed: the request then queues as any other."""
        span = trace.get_tracer("specdec.target").start_span("specdec.verify", context=extract(request.trace_carrier))
        try:
            reply = await ahead.round.future
        except Exception:
            reply = None
        if reply is None or reply.verification is None:
            span.end()
            return None
        cost = reply.verification.cost
        if cost is not None:  # the pass ran before the round came: its wait is not a round's
            reply.verification.cost = replace(cost, ahead=True)
        span.set_attributes({"specdec.k": 0, "specdec.lookahead": True, "specdec.context_tokens": len(ahead.tokens)})
        span.end()
        metrics.VERIFY_ROUNDS.inc()
        self.lookahead_hits += 1
        self._plain[request.session_id] = 2
        self._look_ahead(request.session_id, ahead.tokens, reply, request.sampling)
        return reply

    def _look_ahead(self, session_id: str, tokens: list[int], reply: VerifyReply, sampling) -> None:
        """Queue the round after `reply` (a round without drafts over `tokens`), when the
        session decodes without drafts and the round fits the model."""
        if not self.config.lookahead or self.draining or self._plain.get(session_id, 0) < 2:
            return
        if session_id in self._queued_sessions():  # its next round came first: one round a session
            return
        following = [*tokens, *reply.verification.accepted_ids]
        if len(following) + 1 > min(self.loaded.max_context, self.verifier.pool.capacity_tokens):
            return
        request = VerifyRequest(session_id, reply.held, following[reply.held :], [], None, sampling)
        round_ = _Round(request, asyncio.get_running_loop().create_future(), ahead=True)
        round_.item = VerifyItem(session_id, following, DraftProposal([]), sampling)
        self._ahead[session_id] = Ahead(reply.held, following, sampling, round_)
        self._queue.append(round_)
        self._wakeup.set()

    def _drop(self, ahead: Ahead) -> None:
        """Forget a look-ahead the coordinator did not send: unqueue it if its pass has not begun."""
        if ahead.round in self._queue:
            self._queue.remove(ahead.round)

    async def end_session(self, session_id: str) -> None:
        """Free the session. Returns once it is freed, so that a caller who awaited it sees the
        blocks back: a look-ahead's pass may hold them, and then they are freed after it."""
        self._expected.discard(session_id)
        self._plain.pop(session_id, None)
        ahead = self._ahead.pop(session_id, None)
        if ahead is not None:
            self._drop(ahead)
            if ahead.round in self._batch:
                self._ending.add(session_id)
                await asyncio.shield(self._pass_over)
                return
        self.verifier.end_session(session_id)
        self._gauges()

    def _gauges(self) -> None:
        metrics.QUEUE_DEPTH.set(len(self._queue))
        self.peaks["sessions"] = max(self.peaks["sessions"], len(self.verifier.sessions))
        self.peaks["cached_tokens"] = max(self.peaks["cached_tokens"], self.verifier.sessions.total_tokens)
        self.peaks["kv_blocks"] = max(self.peaks["kv_blocks"], self.verifier.pool.used_blocks)

    def finished_spans(self) -> list[dict]:
        """Spans this actor recorded, when configured with trace_in_memory."""
        spans = self._spans.get_finished_spans() if self._spans else ()
        return [
            {
                "name": s.name,
                "trace_id": f"{s.context.trace_id:032x}",
                "parent_span_id": f"{s.parent.span_id:016x}" if s.parent else "",
                "attributes": dict(s.attributes),
            }
            for s in spans
        ]

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            await self._gather()
            batch, self._queue = self._queue[: self.config.max_batch], self._queue[self.config.max_batch :]
            metrics.QUEUE_DEPTH.set(len(self._queue))
            self._running = len(batch)
            self._batch, self._pass_over = batch, loop.create_future()
            started = time.perf_counter()
            try:
                await loop.run_in_executor(self._pass_thread, self._step, batch)
            except Exception as error:  # a failed pass fails its rounds, never the worker
                for round_ in batch:
                    round_.fail(error)
            self._last_pass_s = time.perf_counter() - started
            self._running, self._batch = 0, []
            ended, self._ending = self._ending, set()
            for session_id in ended:
                self.verifier.end_session(session_id)
            self._pass_over.set_result(None)
            self._gauges()
            # Rounds the pass did not finish keep their place at the head of the queue (a
            # look-ahead of a session ended meanwhile has no one waiting for it).
            unfinished = [r for r in batch if not r.settled and r.request.session_id not in ended]
            self._queue = unfinished + self._queue
            for round_ in batch:
                if round_.answered and not round_.ahead:
                    self._count_plain(round_.request)
                    if plain(round_.request):
                        request = round_.request
                        self._look_ahead(request.session_id, round_.item.tokens, round_.reply, request.sampling)
            answered = {r.request.session_id for r in batch if r.answered}
            self._expected = answered - ended - self._queued_sessions()

    def _count_plain(self, request: VerifyRequest) -> None:
        """Count the session's rounds in a row without drafts; forget sessions the verifier no
        longer holds (ended by TTL or LRU) once there are more than it may hold."""
        sid = request.session_id
        self._plain[sid] = min(2, self._plain.get(sid, 0) + 1) if plain(request) else 0
        if len(self._plain) > 2 * self.config.max_sessions:
            held = self.verifier.sessions
            self._plain = {s: n for s, n in self._plain.items() if s in held}
            for session_id in [s for s in self._ahead if s not in held]:
                # Unqueued too: left queued, it would sit beside its session's next round (two
                # rounds for one request) and, run, bring an evicted session back.
                self._drop(self._ahead.pop(session_id))

    async def _gather(self) -> None:
        """Wait until every session in `_expected` has queued its round, the batch is full, or
        the gathering time is up."""
        wait = min(self.config.gather_s, self.config.gather_fraction * self._last_pass_s)
        deadline = asyncio.get_running_loop().time() + wait
        while self._expected - self._queued_sessions() and len(self._queue) < self.config.max_batch:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except TimeoutError:
                return

    def _queued_sessions(self) -> set[str]:
        return {round_.request.session_id for round_ in self._queue}

    def _step(self, batch: list[_Round]) -> None:
        """One engine pass over `batch` (in the worker thread); settles the rounds it finishes."""
        live = []
        for round_ in batch:
            if round_.item is None and not self._admit(round_):
                continue
            live.append(round_)
        if not live:
            return
        started = time.perf_counter()
        results = self.verifier.step([round_.item for round_ in live])
        metrics.FORWARD_LATENCY.observe(time.perf_counter() - started)
        self.batch_sizes.append(len(live))
        metrics.VERIFY_BATCH_SIZE.observe(len(live))
        preempted = self.verifier.sessions.evicted.pressure
        metrics.KV_PREEMPTIONS.inc(preempted - self._preempted)
        self._preempted = preempted
        for round_ in live:
            result = results.get(round_.item)
            if result is None:
                continue  # needs another pass
            if isinstance(result, ItemRejected):
                round_.settle(VerifyReply(None, error=str(result)), error=result)
            elif isinstance(result, Exception):
                round_.fail(result)
            else:
                if round_.ahead:  # answered to its coordinator's round later (`_answer_ahead`)
                    round_.answered = True
                    round_.settle(VerifyReply(result, held=len(round_.item.tokens) + result.num_accepted))
                    continue
                metrics.VERIFY_ROUNDS.inc()
                round_.span.set_attributes(
                    {
                        "specdec.batch_size": len(live),
                        "specdec.k": len(round_.item.proposal.token_ids),
                        "specdec.num_accepted": result.num_accepted,
                        "specdec.context_tokens": len(round_.item.tokens),
                    }
                )
                round_.answered = True
                round_.settle(VerifyReply(result, held=len(round_.item.tokens) + result.num_accepted))

    def _admit(self, round_: _Round) -> bool:
        """Admit a round when it first reaches the engine (`Scheduler.admit`); False when it is
        settled already (a miss, or a request beyond the model's context)."""
        request = round_.request
        admitted = self.verifier.scheduler.admit(request)
        if admitted is None:
            metrics.VERIFY_MISSES.inc()
            round_.settle(VerifyReply(None, miss=True))
            return False
        if isinstance(admitted, ItemRejected):
            round_.settle(VerifyReply(None, error=str(admitted)))
            return False
        round_.item = admitted
        # One span per round, in the trace of the request it belongs to, though the rounds of
        # many requests share the forward pass.
        tracer = trace.get_tracer("specdec.target")
        round_.span = tracer.start_span("specdec.verify", context=extract(request.trace_carrier))
        return True


@dataclass
class _Round:
    """A queued verify call, and what the engine made of it so far."""

    request: VerifyRequest
    future: asyncio.Future
    item: VerifyItem | None = None  # its context, resolved when it first reached the engine
    span: trace.Span | None = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    settled: bool = False  # set at once in the worker thread; the future follows on the loop
    answered: bool = False  # settled with a verification: its session will likely send another round
    ahead: bool = False  # a round run ahead of its coordinator (target_service/lookahead.py)
    reply: VerifyReply | None = None  # what it was answered

    def settle(self, reply: VerifyReply | None, error: Exception | None = None) -> None:
        """Answer `reply`, or raise `error` to the caller when there is no reply; either way the
        round's span records the error and ends."""
        self.settled, self.reply = True, reply
        if self.span is not None:
            if error is not None:
                self.span.record_exception(error)
            self.span.end()
            self.span = None
        self.loop.call_soon_threadsafe(_set, self.future, reply, error)

    def fail(self, error: Exception) -> None:
        self.settle(None, error)


def _set(future: asyncio.Future, reply: VerifyReply | None, error: Exception | None) -> None:
    if future.done():
        return
    if reply is None:
        future.set_exception(error)
    else:
        future.set_result(reply)


def _end_node() -> None:
    """Kill this worker process's raylet (its parent: Ray workers are the raylet's children).
    Killed, not terminated: `ray start --block` takes a raylet's SIGTERM exit for a graceful stop
    and would go on blocking; an unexpected exit ends it, and with it the pod's container."""
    log.warning("the Ray head answers as a new cluster: ending this node, to rejoin it restarted")
    os.kill(os.getppid(), signal.SIGKILL)


def remote_actor_class(num_gpus: int, num_cpus: int = 1, max_restarts: int = -1):
    """The actor class for Ray: a GPU each when there are GPUs, else `num_cpus` CPUs; Ray revives
    it when it dies."""
    return ray.remote(
        num_gpus=num_gpus, num_cpus=0 if num_gpus else num_cpus, max_restarts=max_restarts, max_concurrency=1000
    )(TargetActor)
