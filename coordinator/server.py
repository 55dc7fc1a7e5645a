"""GenerationService over gRPC (grpc.aio): translation between specdec.v1 messages and the engine.

Every call runs through `Calls` (calls.py), as the HTTP API's do. Status codes: INVALID_ARGUMENT
names the field (the engine's `prepare` decides what is valid); RESOURCE_EXHAUSTED beyond
`max_inflight` requests generating at once; DEADLINE_EXCEEDED when the call's deadline passes mid-
generation (the engine runs under the deadline the client set); UNAVAILABLE when the target tier
cannot answer (a failing draft tier only turns speculation off: the engine's fallback). Bytes that
do not parse as the request are INVALID_ARGUMENT too (naming the string field that is not UTF-8,
when that is why), and a request over `MAX_MESSAGE_BYTES` is RESOURCE_EXHAUSTED from grpc itself.
A client that cancels cancels the engine, whose `finally` ends the request's sessions on both
tiers (the draft tier's within `draft_timeout_s`; a draft tier slower than that ends it shortly
after, or its TTL does). Each call is one server span; its trace id (32 lowercase hex) is on every
response. The standard health service says SERVING while the server runs and NOT_SERVING from the
start of a stop; reflection lists GenerationService and Health.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from google.protobuf import descriptor, empty_pb2, message_factory, unknown_fields
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace

from specdec.coordinator import metrics
from specdec.coordinator.calls import CallEnded, CallFailed, Calls, CallSpan, OnDelta, ServingStats
from specdec.coordinator.convert import request_from_proto, response_to_proto
from specdec.coordinator.engine import Delta, SpeculativeEngine
from specdec.coordinator.http_api import HttpApi, HttpServer
from specdec.core import wire
from specdec.core.settings import setting
from specdec.draft_service.auth import BearerAuth
from specdec.v1 import generation_pb2 as pb
from specdec.v1 import generation_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GenerationService"].full_name

# A prompt as long as any model's context is well under 1 MiB of text; grpc's own default (4 MiB
# in, unbounded out) would let a response grow without limit.
MAX_MESSAGE_BYTES = 16 << 20
SERVER_OPTIONS = wire.server_options(MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES)
HTTP_PORT = 8000  # the OpenAI-compatible API's, as vLLM's


@dataclass(frozen=True)
class ServerConfig:
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(50051, "port to bind; 0 picks a free one (printed at start)", type="port")
    max_inflight: int = setting(64, "requests generating at once; more get RESOURCE_EXHAUSTED", type="positive_int")
    grace_s: float = setting(10.0, "seconds calls in flight get to finish after SIGTERM", type="seconds")
    # The OpenAI-compatible HTTP API (http_api.py) on host:http_port; 0 picks a free port, None
    # serves none (the CLI's --http-port 0).
    http_port: int | None = setting(
        None,
        "port of the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions) on the same host; 0: none",
        type="port",
        cli_default=HTTP_PORT,
    )
    served_model_name: str | None = setting(None, "the model's id in the HTTP API (default: the target model's name)")
    # (certificate chain PEM, private key PEM): serve TLS on the port; None serves plaintext.
    tls: tuple[bytes, bytes] | None = field(default=None, repr=False)
    # Calls on both APIs must carry `authorization: Bearer <api_key>` (health exempt): gRPC
    # UNAUTHENTICATED, HTTP 401 without it. None: no key.
    api_key: str | None = setting(
        None,
        "clients of both APIs must send 'authorization: Bearer <key>' (health exempt); "
        "prefer the env variable: flags show in ps",
        repr=False,
        secret=True,
    )


class GenerationServicer(generation_pb2_grpc.GenerationServiceServicer):
    def __init__(self, calls: Calls):
        self.calls = calls
        self.engine = calls.engine

    @property
    def stats(self) -> ServingStats:
        return self.calls.stats

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        token_ids: list[int] = []
        text: list[str] = []
        final: list[tuple[Delta, str]] = []

        async def collect(delta: Delta, trace_id: str) -> None:
            token_ids.extend(delta.token_ids)
            text.append(delta.text)
            if delta.finish_reason is not None:
                final.append((delta, trace_id))

        await self._run(request, "Generate", context, collect)
        delta, trace_id = final[0]
        delta.token_ids, delta.text = token_ids, "".join(text)
        return response_to_proto(delta, trace_id)

    async def GenerateStream(self, request: pb.GenerateStreamRequest, context: grpc.aio.ServicerContext) -> None:
        # context.write from the engine's task rather than an async-generator handler: the whole
        # call, writes included, then runs under the deadline, and a client that cancels or a
        # deadline ends it in that one place, not whenever an abandoned generator is collected.
        sent = 0  # tokens so far: the last message's usage counts them all

        async def send(delta: Delta, trace_id: str) -> None:
            nonlocal sent
            sent += len(delta.token_ids)
            if delta.token_ids or delta.text or delta.finish_reason is not None:
                try:
                    await context.write(_delta_to_proto(delta, trace_id, sent))
                except Exception as e:  # noqa: BLE001 - grpc raises a private error type here
                    raise CallEnded() from e

        await self._run(request, "GenerateStream", context, send)

    async def _run(self, request, method: str, context: grpc.aio.ServicerContext, on_delta: OnDelta) -> None:
        """One call through `Calls.run`; every failure leaves as its status."""
        span = CallSpan(
            f"{SERVICE_NAME}/{method}",
            {"rpc.system": "grpc", "rpc.service": SERVICE_NAME, "rpc.method": method},
            lambda code: {"rpc.grpc.status_code": code.value[0]},
        )
        try:
            await self.calls.run(request_from_proto(request), method, span, context.time_remaining(), on_delta)
        except CallFailed as e:
            await context.abort(e.code, e.message)


def _delta_to_proto(delta: Delta, trace_id: str, completion_tokens: int) -> pb.GenerateStreamResponse:
    """One round's delta; the last one also carries the final fields of a GenerateResponse."""
    if delta.finish_reason is None:
        return pb.GenerateStreamResponse(text=delta.text, token_ids=delta.token_ids, trace_id=trace_id)
    final = response_to_proto(delta, trace_id)
    final.usage.completion_tokens = completion_tokens  # the request's, not this delta's
    return pb.GenerateStreamResponse(
        text=final.text,
        token_ids=final.token_ids,
        finish_reason=final.finish_reason,
        usage=final.usage,
        speculation=final.speculation,
        trace_id=trace_id,
    )


def _add_generation_service(servicer: GenerationServicer, server: grpc.aio.Server) -> None:
    """What the generated `add_GenerationServiceServicer_to_server` does, but the handlers parse
    their requests themselves: bytes that grpc's deserializer refuses get UNKNOWN "Unexpected
    <class '...DecodeError'>: ... String field had bad UTF-8" from grpc.aio (measured),
    which names no field."""
    handlers = {
        "Generate": grpc.unary_unary_rpc_method_handler(
            _parsing(servicer.Generate, pb.GenerateRequest), response_serializer=pb.GenerateResponse.SerializeToString
        ),
        "GenerateStream": grpc.unary_stream_rpc_method_handler(
            _parsing(servicer.GenerateStream, pb.GenerateStreamRequest),
            response_serializer=pb.GenerateStreamResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _parsing(method, message_type):
    """`method` behind a parse of the raw request bytes that answers INVALID_ARGUMENT."""

    async def handler(raw: bytes, context: grpc.aio.ServicerContext):
        try:
            request = message_type.FromString(raw)
        except DecodeError:
            metrics.REQUESTS.labels("", grpc.StatusCode.INVALID_ARGUMENT.name).inc()
            problem = (
                _why_unparsable(message_type.DESCRIPTOR, raw)
                or f"request: is not a serialized {message_type.DESCRIPTOR.full_name}"
            )
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return await method(request, context)

    return handler


def _why_unparsable(message: descriptor.Descriptor, raw: bytes, prefix: str = "") -> str | None:
    """The field of `message` that makes `raw` unparsable, as "field: problem" (a string that is
    not UTF-8, as proto3 requires, or a sub-message that does not parse), or None: protobuf only
    says that the message failed. Parsed as an Empty, every field is an unknown field: raw bytes."""
    holder = empty_pb2.Empty()
    try:
        holder.ParseFromString(raw)
    except DecodeError:
        return None  # not even the wire format
    for unknown in unknown_fields.UnknownFieldSet(holder):
        field = message.fields_by_number.get(unknown.field_number)
        if field is None or not isinstance(unknown.data, bytes):
            continue  # an unknown field, or another wire type: protobuf skips it
        name = prefix + field.name
        if field.type == descriptor.FieldDescriptor.TYPE_STRING:
            try:
                unknown.data.decode("utf-8")
            except UnicodeDecodeError:
                return f"{name}: is not valid UTF-8"
        elif field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
            try:
                message_factory.GetMessageClass(field.message_type).FromString(unknown.data)
            except DecodeError:
                return (
                    _why_unparsable(field.message_type, unknown.data, name + ".")
                    or f"{name}: is not a serialized {field.message_type.full_name}"
                )
    return None


class GenerationServer:
    """GenerationService, health and reflection on one port, and the HTTP API on another when
    configured: `start`, then `stop`."""

    def __init__(
        self, engine: SpeculativeEngine, config: ServerConfig = ServerConfig(), tracer: trace.Tracer | None = None
    ):
        self.config = config
        self.calls = Calls(engine, config.max_inflight, tracer)
        self.servicer = GenerationServicer(self.calls)
        self.health = health_aio.HealthServicer()
        interceptors = [BearerAuth(config.api_key, "missing or wrong API key")] if config.api_key else []
        self.server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
        _add_generation_service(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection((SERVICE_NAME, health_name, reflection.SERVICE_NAME), self.server)
        self.port = 0
        self.http: HttpServer | None = None
        if config.http_port is not None:
            name = config.served_model_name or self.calls.model_name
            api = HttpApi(self.calls, name, engine.target.max_context, api_key=config.api_key)
            self.http = HttpServer(api, config.host, config.http_port, config.grace_s, tls=config.tls)
        self.http_port = 0  # bound by `start`

    @property
    def stats(self) -> ServingStats:
        return self.calls.stats

    async def start(self) -> int:
        """Bind and serve; returns the bound port. A busy port raises RuntimeError."""
        address = f"{self.config.host}:{self.config.port}"
        if self.config.tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            cert_chain, private_key = self.config.tls
            self.port = self.server.add_secure_port(address, grpc.ssl_server_credentials([(private_key, cert_chain)]))
        await self.server.start()
        if self.http is not None:
            try:
                self.http_port = await self.http.start()
            except BaseException:
                await self.server.stop(0)
                raise
        await self.set_serving(True)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """Health SERVING or NOT_SERVING on both APIs (the coordinator's tiers reachable or not); calls are
        still taken either way, and get UNAVAILABLE while the target tier is gone."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)
        if self.http is not None:
            self.http.api.serving = serving  # GET /health: 200 or 503

    async def follow(self, reachable: Callable[[], Awaitable[bool]], every_s: float) -> None:
        """Health follows `reachable` (the target tier: does any actor answer?), checked every
        `every_s` until cancelled: NOT_SERVING while it says no (a head restart, a pool scaled to
        zero), so balancers send calls elsewhere; SERVING again once it says yes."""
        serving = True
        while True:
            await asyncio.sleep(every_s)
            now = await reachable()
            if now != serving:
                log.warning("target tier %s", "reachable again" if now else "unreachable: health NOT_SERVING")
                await self.set_serving(now)
                serving = now

    async def stop(self, grace_s: float | None = None) -> None:
        """NOT_SERVING, refuse new calls, give calls in flight `grace_s` (default: the config's)."""
        await self.health.enter_graceful_shutdown()
        grace_s = self.config.grace_s if grace_s is None else grace_s
        if self.http is not None:
            await asyncio.gather(self.server.stop(grace_s), self.http.stop(grace_s))
        else:
            await self.server.stop(grace_s)
