"""DraftService over gRPC (grpc.aio): translation between specdec.v1 messages and `DraftCore`.

Status codes: INVALID_ARGUMENT names the field; FAILED_PRECONDITION with a message starting
"session miss" asks the client to resend the full context; RESOURCE_EXHAUSTED when the model's
queue is full; DEADLINE_EXCEEDED for calls whose deadline passed before work started;
UNAVAILABLE while the model loads or the server drains; UNAUTHENTICATED, when the server has a
token, for calls without `authorization: Bearer <token>` (health checks need none, so probes
work). The standard health service says SERVING once the model is loaded and NOT_SERVING from
the start of a drain; reflection lists DraftService and Health.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

from specdec.core import draft_source
from specdec.core.errors import InvalidArgument
from specdec.core.packing import pack_probs
from specdec.core.sampling import SamplingParams
from specdec.core.settings import setting
from specdec.core.wire import MAX_PROPOSE_REQUEST_BYTES, MAX_PROPOSE_RESPONSE_BYTES, SESSION_MISS, server_options
from specdec.draft_service import metrics
from specdec.draft_service.auth import BearerAuth
from specdec.draft_service.service import (
    DeadlineExpired,
    DraftConfig,
    DraftCore,
    Overloaded,
    ProposeCall,
    ProposeResult,
    SessionEnded,
    SessionMiss,
)
from specdec.draft_service.suffix import SuffixConfig
from specdec.telemetry.metrics import MetricsServer
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name
_KNOWN_ENCODINGS = frozenset(common_pb2.DraftProbsEncoding.values())
# Packing a dense Gemma-vocabulary q (1 MiB per row) takes milliseconds: off the event loop.
_PACK_IN_THREAD_ELEMENTS = 1 << 16
# The draft protocol's limits, the ones the draft client sends and accepts (DraftClientConfig).
SERVER_OPTIONS = server_options(MAX_PROPOSE_REQUEST_BYTES, MAX_PROPOSE_RESPONSE_BYTES)


@dataclass(frozen=True)
class ServerConfig:
    draft_model: str = setting(
        "ngram",
        "local dir, .gguf file, hub id, 'ngram' (prompt lookup, no model), 'suffix' (suffix decoding over "
        "the request and earlier completions, no model), 'hybrid:<model>' (prompt lookup where the context "
        "repeats, the model elsewhere) or 'suffix:<model>' (suffix decoding where it matches, the model elsewhere)",
    )
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(50052, "port to bind; 0 picks a free one (printed at start)", type="port")
    metrics_port: int = setting(9465, "Prometheus metrics port (on --host); 0 picks a free one", type="port")
    grace_s: float = setting(10.0, "seconds in-flight calls get to finish after SIGTERM", type="seconds")
    # So that balancers move first.
    drain_delay_s: float = setting(
        0.0, "seconds to report NOT_SERVING before refusing calls after SIGTERM", type="seconds"
    )
    auth_token: str | None = setting(  # None: no check
        None,
        "calls but health checks must carry 'authorization: Bearer <token>' "
        "(prefer the env variable: flags show in ps)",
        repr=False,
        secret=True,
    )
    draft: DraftConfig = field(default_factory=DraftConfig)
    suffix: SuffixConfig = field(default_factory=SuffixConfig)  # for the suffix drafters only


class DraftServicer(draft_pb2_grpc.DraftServiceServicer):
    def __init__(self, core: DraftCore | None = None):
        self.core = core  # None while the model loads
        self.draining = False

    async def Propose(
        self, request: draft_pb2.ProposeRequest, context: grpc.aio.ServicerContext
    ) -> draft_pb2.ProposeResponse:
        started = time.perf_counter()
        code = grpc.StatusCode.UNKNOWN  # until the call ends one way or another
        metrics.REQUESTS_RUNNING.inc()
        try:
            core = self.core
            if self.draining or core is None:
                code = grpc.StatusCode.UNAVAILABLE
                await context.abort(code, "draft replica is draining" if self.draining else "draft model is loading")
            timeout = context.time_remaining()
            try:
                call = _call_from_proto(request, timeout)
                result = await core.propose(call)
            except InvalidArgument as e:
                code = grpc.StatusCode.INVALID_ARGUMENT
                await context.abort(code, str(e))
            except SessionMiss as e:
                code = grpc.StatusCode.FAILED_PRECONDITION
                await context.abort(code, f"{SESSION_MISS}: {e}")
            except SessionEnded as e:
                code = grpc.StatusCode.FAILED_PRECONDITION
                await context.abort(code, str(e))
            except Overloaded as e:
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
                await context.abort(code, str(e))
            except DeadlineExpired as e:
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                await context.abort(code, str(e))
            span = trace.get_current_span()  # the Propose server span (OpenTelemetry's gRPC instrumentation)
            span.set_attribute("specdec.draft.source", result.proposal.source)
            span.set_attribute("specdec.draft.tokens", len(result.proposal.token_ids))
            span.set_attribute("specdec.draft.tree", result.proposal.parents is not None)
            if result.suffix:
                span.set_attribute("specdec.suffix.found_in", result.suffix)
            response = await _response_to_proto(result, request.probs_encoding)
            code = grpc.StatusCode.OK
            metrics.PROPOSE_LATENCY.observe(time.perf_counter() - started)
            return response
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            metrics.REQUESTS_RUNNING.dec()
            metrics.PROPOSE_CALLS.labels(code.name).inc()

    async def EndSession(
        self, request: draft_pb2.EndSessionRequest, context: grpc.aio.ServicerContext
    ) -> draft_pb2.EndSessionResponse:
        if self.core is not None:
            try:
                self.core.end_session(request.session_id, request.completion_token_ids)
            except InvalidArgument as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return draft_pb2.EndSessionResponse()


def _call_from_proto(request: draft_pb2.ProposeRequest, timeout_s: float | None) -> ProposeCall:
    if request.probs_encoding not in _KNOWN_ENCODINGS:
        raise InvalidArgument("probs_encoding", f"unknown value {request.probs_encoding}")
    s = request.sampling
    sampling = SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p or 1.0,  # 0 or unset means 1 on the wire
        top_k=s.top_k,
        seed=s.seed if s.HasField("seed") else None,
    )
    model_k = request.model_draft_tokens if request.HasField("model_draft_tokens") else None
    return ProposeCall(
        request.session_id,
        request.committed_len,
        list(request.new_tokens),
        request.num_draft_tokens,
        sampling,
        timeout_s,
        model_k,
        request.tree,
    )


async def _response_to_proto(result: ProposeResult, encoding: int) -> draft_pb2.ProposeResponse:
    response = draft_pb2.ProposeResponse(
        token_ids=result.proposal.token_ids,
        cached_len=result.cached_len,
        source=draft_source.to_proto(result.proposal.source),
        parent_indices=result.proposal.parents or [],
    )
    q = result.proposal.draft_probs  # (k, vocab), only when sampling with the model drafter
    if q is not None:
        # fp16 would round q, and the tokens were drawn from the unrounded q: the verifier must
        # see the very q they came from, so a request for fp16 gets the smaller exact encoding.
        if encoding == common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP16:
            encoding = common_pb2.DRAFT_PROBS_ENCODING_UNSPECIFIED
        if q.numel() >= _PACK_IN_THREAD_ELEMENTS:
            packed = await asyncio.to_thread(pack_probs, q, encoding)
        else:
            packed = pack_probs(q, encoding)
        response.draft_probs.CopyFrom(packed)
    return response


class DraftServer:
    """DraftService, health and reflection on one port. Start it, then `set_core` once the model
    is loaded (health turns SERVING); `begin_drain` then `stop` to shut down gracefully. With an
    `auth_token`, every call but health checks must carry it."""

    def __init__(self, core: DraftCore | None = None, auth_token: str | None = None):
        self.servicer = DraftServicer()
        self.health = health_aio.HealthServicer()
        # A server span per DraftService call, joined to the caller's trace through the gRPC
        # metadata. Only DraftService: the interceptor takes every streaming handler for an async
        # generator, and Health.Watch is not one (it broke Watch, measured).
        interceptors = [aio_server_interceptor(filter_=filters.service_name(SERVICE_NAME))]
        if auth_token:
            interceptors.insert(0, BearerAuth(auth_token))  # first: a refused call opens no span
        self.server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
        draft_pb2_grpc.add_DraftServiceServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self.server,
        )
        self._initial_core = core
        self.port = 0

    @property
    def core(self) -> DraftCore | None:
        return self.servicer.core

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind and serve (health NOT_SERVING until a core is set); returns the bound port."""
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        await self.server.start()
        if self._initial_core is not None:
            await self.set_core(self._initial_core)
        return self.port

    async def set_core(self, core: DraftCore) -> None:
        self.servicer.core = core
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def announce_drain(self) -> None:
        """Health says NOT_SERVING for good while calls are still served: balancers and clients
        move away before anything is refused."""
        await self.health.enter_graceful_shutdown()

    async def begin_drain(self) -> None:
        """NOT_SERVING for good; new Propose calls get UNAVAILABLE, calls in flight go on."""
        self.servicer.draining = True
        await self.announce_drain()

    async def stop(self, grace_s: float | None) -> None:
        """Refuse new connections, give calls in flight `grace_s` to finish, then close."""
        await self.begin_drain()
        await self.server.stop(grace_s)
        if self.core is not None:
            await self.core.close()


def load_core(config: ServerConfig) -> DraftCore:
    from specdec.draft_service.hybrid import HybridConfig, parse_spec, uses_suffix
    from specdec.draft_service.registry import draft_model

    spec = config.draft_model
    suffix = config.suffix if uses_suffix(spec) else None
    model = draft_model(spec)
    if model is None:
        return DraftCore(None, config.draft, suffix=suffix)
    from specdec.drafts.loading import load_model

    # "hybrid:SPEC" / "suffix:SPEC": lookup rounds where they match
    hybrid = None if parse_spec(spec) is None else HybridConfig()
    return DraftCore(load_model(model), config.draft, hybrid=hybrid, suffix=suffix)


async def serve(
    config: ServerConfig, on_listening: Callable[[int, int], None] = lambda port, metrics_port: None
) -> None:
    """Serve until SIGTERM or SIGINT, then drain: NOT_SERVING, `drain_delay_s`, finish in-flight calls."""
    metrics_server = MetricsServer(config.host, config.metrics_port)
    server = DraftServer(auth_token=config.auth_token)
    port = await server.start(config.host, config.port)
    on_listening(port, metrics_server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loading = asyncio.ensure_future(asyncio.to_thread(load_core, config))  # health answers meanwhile
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([loading, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            await server.set_core(loading.result())  # a model that fails to load ends the process
            await stopping
        if config.drain_delay_s > 0:
            # Still answering: sessions here keep their drafts while balancers see NOT_SERVING.
            await server.announce_drain()
            await asyncio.sleep(config.drain_delay_s)
        await server.begin_drain()
    finally:
        await server.stop(config.grace_s)
        metrics_server.close()
