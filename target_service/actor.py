"""The Ray actor around the verifier: continuous batching of queued verify calls.

Ray delivers concurrent `verify` calls to this async actor; each waits on a future while one
worker task drains whatever is queued whenever the model is free and verifies it in a single
forward pass (in a thread, so the event loop keeps accepting calls meanwhile). A restarted actor
has lost its caches: every session then answers `miss` once and is re-prefilled by the pool.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import ray
import torch
from opentelemetry import trace
from opentelemetry.propagate import extract

from specdec.core.acceptance import DraftProposal
from specdec.core.session_store import SessionStore
from specdec.drafts.loading import load_model
from specdec.target_service import metrics
from specdec.target_service.protocol import VerifyReply, VerifyRequest
from specdec.target_service.verifier import TargetVerifier, VerifyItem, cached_tokens
from specdec.telemetry.metrics import MetricsServer
from specdec.telemetry.tracing import configure_tracing


@dataclass(frozen=True)
class ActorConfig:
    target_model: str | None = None  # load_model spec; None = the embedded default
    max_batch: int = 32  # rounds verified in one forward pass at most
    max_sessions: int = 256  # cached sessions per actor (LRU beyond)
    max_cached_tokens: int = 262_144  # summed cached positions per actor (LRU beyond)
    session_ttl_s: float = 600.0  # idle sessions expire (a coordinator that died never ends them)
    half_precision: bool = True  # bf16 weights when on a GPU; fp32 on CPU always
    metrics_host: str = "127.0.0.1"  # Prometheus /metrics of the actor
    metrics_port: int = 9466  # the first free port from here on (actors sharing a node count up); 0 picks any
    gpus: float | None = None  # GPUs Ray reserves per actor; None: 1 when the cluster (or this machine) has any
    cpus: int = 1  # on a CPU node: the CPUs Ray reserves for the actor and the torch threads it runs
    trace_in_memory: bool = False  # keep finished spans for `finished_spans` (tests)
    trace_file: str | None = None  # also append finished spans here as JSON lines (`specdec up`)


class TargetActor:
    def __init__(self, config: ActorConfig):
        self.config = config
        self._spans = configure_tracing("specdec-target", memory=config.trace_in_memory, file=config.trace_file)
        cuda = torch.cuda.is_available()
        if not cuda:
            # Ray sets OMP_NUM_THREADS to the actor's CPU reservation (1 unless told): without
            # this a CPU target would run its matmuls on one core of however many it holds.
            torch.set_num_threads(config.cpus)
        dtype = torch.bfloat16 if cuda and config.half_precision else torch.float32
        self.loaded = load_model(config.target_model, dtype=dtype, device="cuda" if cuda else "cpu")
        store = SessionStore(config.max_sessions, config.max_cached_tokens, config.session_ttl_s, size=cached_tokens)
        self.verifier = TargetVerifier(self.loaded, store)
        self._queue: list[tuple[VerifyRequest, asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self.batch_sizes: list[int] = []  # forward passes so far, by batch size (for tests and bench)
        # High-water marks, taken after every batch and every queued call (the reliability tests
        # check them against the bounds).
        self.peaks = {"sessions": 0, "cached_tokens": 0, "queued": 0}
        self.started_at = time.time()
        # Read when scraped: an actor whose coordinator died gets no more calls, and a scrape
        # then expires the sessions by TTL and shows them gone.
        metrics.SESSIONS.set_function(lambda: len(self.verifier.sessions))
        metrics.CACHE_TOKENS.set_function(lambda: self.verifier.sessions.total_tokens)
        # The first free port from metrics_port on: actors sharing a node count up from it.
        self.metrics = MetricsServer(config.metrics_host, config.metrics_port, search=64)

    def info(self) -> dict:
        return {
            "model": self.loaded.name,
            "device": str(next(self.loaded.model.parameters()).device),  # "cpu", "cuda:0", ...
            "vocab_size": self.loaded.vocab_size,
            "max_context": self.loaded.max_context,
            "eos_token_ids": sorted(self.loaded.eos_token_ids),
            "sessions": len(self.verifier.sessions),
            "cached_tokens": self.verifier.sessions.total_tokens,
            "queued": len(self._queue),
            "peaks": dict(self.peaks),
            "max_sessions": self.config.max_sessions,
            "max_cached_tokens": self.config.max_cached_tokens,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "batch_sizes": list(self.batch_sizes),
            "metrics_address": self.metrics.address,
        }

    async def verify(self, request: VerifyRequest) -> VerifyReply:
        if self._worker is None:  # the actor's event loop exists only once a call runs
            self._wakeup = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._drain())
        future = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        self.peaks["queued"] = max(self.peaks["queued"], len(self._queue))
        metrics.QUEUE_DEPTH.set(len(self._queue))
        self._wakeup.set()
        return await future

    def end_session(self, session_id: str) -> None:
        self.verifier.end_session(session_id)
        self._gauges()

    def _gauges(self) -> None:
        metrics.QUEUE_DEPTH.set(len(self._queue))
        self.peaks["sessions"] = max(self.peaks["sessions"], len(self.verifier.sessions))
        self.peaks["cached_tokens"] = max(self.peaks["cached_tokens"], self.verifier.sessions.total_tokens)

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
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                batch, self._queue = self._queue[: self.config.max_batch], self._queue[self.config.max_batch :]
                metrics.QUEUE_DEPTH.set(len(self._queue))
                try:
                    replies = await asyncio.to_thread(self._verify_batch, [request for request, _ in batch])
                except Exception as error:  # one bad batch must not kill the worker
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                self._gauges()
                for (_, future), reply in zip(batch, replies):
                    if not future.done():
                        future.set_result(reply)

    def _verify_batch(self, requests: list[VerifyRequest]) -> list[VerifyReply]:
        replies: list[VerifyReply | None] = [None] * len(requests)
        items, where = [], []
        for i, request in enumerate(requests):
            context = self._context(request)
            if context is None:
                metrics.VERIFY_MISSES.inc()
                replies[i] = VerifyReply(None, miss=True)
                continue
            if len(context) + len(request.draft_ids) > self.loaded.max_context:
                # The engine never asks this; a caller that does gets a clear error, not a wrong answer.
                replies[i] = VerifyReply(
                    None,
                    error=f"{len(context)} tokens plus {len(request.draft_ids)} drafts exceed "
                    f"the model's context of {self.loaded.max_context}",
                )
                continue
            items.append(VerifyItem(request.session_id, context, _proposal(request), request.sampling))
            where.append(i)
        self.batch_sizes.append(len(items))
        # One span per round, in the trace of the request it belongs to, though the rounds of
        # many requests share the forward pass.
        tracer = trace.get_tracer("specdec.target")
        spans = [tracer.start_span("specdec.verify", context=extract(requests[i].trace_carrier)) for i in where]
        started = time.perf_counter()
        try:
            results = self.verifier.verify_batch(items) if items else []
        except Exception as error:
            for span in spans:
                span.record_exception(error)
                span.end()
            raise
        if items:
            metrics.FORWARD_LATENCY.observe(time.perf_counter() - started)
            metrics.VERIFY_BATCH_SIZE.observe(len(items))
            metrics.VERIFY_ROUNDS.inc(len(items))
        for i, item, result, span in zip(where, items, results, spans):
            span.set_attributes(
                {
                    "specdec.batch_size": len(items),
                    "specdec.k": len(item.proposal.token_ids),
                    "specdec.num_accepted": result.num_accepted,
                    "specdec.context_tokens": len(item.tokens),
                }
            )
            span.end()
            replies[i] = VerifyReply(result, held=len(item.tokens) + result.num_accepted)
        return replies

    def _context(self, request: VerifyRequest) -> list[int] | None:
        """The full committed sequence, or None when this actor lacks the prefix it should hold."""
        if request.committed_len == 0:
            return list(request.new_tokens)
        if request.session_id not in self.verifier.sessions:
            return None
        held = self.verifier.sessions[request.session_id].tokens
        if len(held) < request.committed_len:
            return None
        return held[: request.committed_len] + list(request.new_tokens)


def _proposal(request: VerifyRequest) -> DraftProposal:
    return DraftProposal(list(request.draft_ids), request.draft_probs)


def remote_actor_class(num_gpus: int, num_cpus: int = 1, max_restarts: int = -1):
    """The actor class for Ray: a GPU each when there are GPUs, else `num_cpus` CPUs; Ray revives
    it when it dies."""
    return ray.remote(
        num_gpus=num_gpus, num_cpus=0 if num_gpus else num_cpus, max_restarts=max_restarts, max_concurrency=1000
    )(TargetActor)
