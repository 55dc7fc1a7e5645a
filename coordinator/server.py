"""GenerationService over gRPC (grpc.aio): translation between specdec.v1 messages and the engine.

Status codes: INVALID_ARGUMENT names the field (the engine's `prepare` decides what is valid);
RESOURCE_EXHAUSTED beyond `max_inflight` requests generating at once; DEADLINE_EXCEEDED when the
call's deadline passes mid-generation (the engine runs under the deadline the client set);
UNAVAILABLE when the target tier cannot answer (a failing draft tier only turns speculation off:
the engine's fallback). Bytes that do not parse as the request are INVALID_ARGUMENT too (naming
the string field that is not UTF-8, when that is why), and a request over `MAX_MESSAGE_BYTES`
is RESOURCE_EXHAUSTED from grpc itself. A client that cancels cancels the engine, whose `finally`
ends the request's sessions on both tiers (the draft tier's within `draft_timeout_s`; a draft tier
slower than that ends it shortly after, or its TTL does). Each call is one server
span; its trace id (32 lowercase hex) is on every response. The standard health service says
SERVING while the server runs and NOT_SERVING from the start of a stop; reflection lists
GenerationService and Health.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import grpc
from google.protobuf import descriptor, empty_pb2, message_factory, unknown_fields
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace

from specdec.coordinator import metrics
from specdec.coordinator.convert import request_from_proto, response_to_proto
from specdec.coordinator.engine import Delta, SpeculationStats, SpeculativeEngine
from specdec.core import wire
from specdec.core.errors import InvalidArgument
from specdec.target_service.pool import TargetUnavailable
from specdec.v1 import generation_pb2 as pb
from specdec.v1 import generation_pb2_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GenerationService"].full_name
log = logging.getLogger(__name__)

# A prompt as long as any model's context is well under 1 MiB of text; grpc's own default (4 MiB
# in, unbounded out) would let a response grow without limit.
MAX_MESSAGE_BYTES = 16 << 20
SERVER_OPTIONS = wire.server_options(MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051  # 0 picks a free port
    max_inflight: int = 64  # requests generating at once; more get RESOURCE_EXHAUSTED
    grace_s: float = 10.0  # on stop, calls in flight get this long to finish
    # (certificate chain PEM, private key PEM): serve TLS on the port; None serves plaintext.
    tls: tuple[bytes, bytes] | None = field(default=None, repr=False)


@dataclass
class ServingStats:
    """What the server has done so far (the status line of `specdec up` reads it)."""

    requests: int = 0  # finished calls, whatever their outcome
    failed: int = 0  # finished with an error status (cancelled calls included)
    in_flight: int = 0
    completion_tokens: int = 0  # counted as they are generated
    draft_tokens: int = 0  # of finished requests
    accepted_tokens: int = 0


def capture_content() -> bool:
    """Prompts and completions go into the server span only when the operator sets OpenTelemetry's
    GenAI switch, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true; never into logs."""
    return os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").lower() == "true"


@dataclass
class _Call:
    """One call as the logs, span and metrics report it: counts and timings, never text."""

    started: float
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    trace_id: str = ""
    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stats: SpeculationStats | None = None
    capture: bool = False  # the operator asked for prompts and completions in the span
    prompt: str = ""
    completion: list[str] = field(default_factory=list)

    def add(self, delta: Delta) -> None:
        self.completion_tokens += len(delta.token_ids)
        if self.capture:
            self.completion.append(delta.text)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason.value
            self.prompt_tokens = delta.prompt_tokens
            self.stats = delta.stats
            metrics.PROMPT_TOKENS.inc(delta.prompt_tokens)

    def span_attributes(self) -> dict:
        attributes = {"gen_ai.usage.output_tokens": self.completion_tokens, "rpc.grpc.status_code": self.code.value[0]}
        if self.finish_reason:
            attributes["gen_ai.usage.input_tokens"] = self.prompt_tokens
            attributes["gen_ai.response.finish_reasons"] = [self.finish_reason]
        if self.capture:
            attributes.update({"gen_ai.prompt": self.prompt, "gen_ai.completion": "".join(self.completion)})
        if self.stats is not None:
            attributes.update(
                {
                    "specdec.rounds": self.stats.rounds,
                    "specdec.draft_tokens": self.stats.draft_tokens,
                    "specdec.accepted_tokens": self.stats.accepted_tokens,
                }
            )
        return attributes

    def log_line(self, method: str) -> str:
        s = self.stats
        acceptance = f"{s.acceptance_rate:.3f}" if s is not None and s.draft_tokens else "-"
        return (
            f"request id={self.id} trace_id={self.trace_id or '-'} method={method} code={self.code.name} "
            f"finish={self.finish_reason or '-'} prompt_tokens={self.prompt_tokens} "
            f"completion_tokens={self.completion_tokens} "
            f"rounds={s.rounds if s else 0} acceptance={acceptance} duration_s={time.perf_counter() - self.started:.3f}"
        )


class GenerationServicer(generation_pb2_grpc.GenerationServiceServicer):
    def __init__(self, engine: SpeculativeEngine, max_inflight: int, tracer: trace.Tracer | None = None):
        self.model_name = getattr(getattr(engine, "target", None), "name", "")  # LoadedModel and RemoteTarget name it
        self.engine = engine
        self.max_inflight = max_inflight
        self.tracer = tracer or trace.get_tracer("specdec.coordinator")
        self.stats = ServingStats()

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
        # call, writes included, then runs under `_bounded`, and a client that cancels or a
        # deadline ends it in that one place, not whenever an abandoned generator is collected.
        sent = 0  # tokens so far: the last message's usage counts them all

        async def send(delta: Delta, trace_id: str) -> None:
            nonlocal sent
            sent += len(delta.token_ids)
            if delta.token_ids or delta.text or delta.finish_reason is not None:
                try:
                    await context.write(_delta_to_proto(delta, trace_id, sent))
                except Exception as e:  # noqa: BLE001 - grpc raises a private error type here
                    raise _CallEnded() from e

        await self._run(request, "GenerateStream", context, send)

    async def _run(
        self, request, method: str, context: grpc.aio.ServicerContext, on_delta: Callable[[Delta, str], Awaitable[None]]
    ) -> None:
        """Feed the engine's deltas for one call to `on_delta`, under admission, a server span and
        the call's deadline; every failure leaves as a status."""
        if self.stats.in_flight >= self.max_inflight:
            metrics.REQUESTS.labels("", grpc.StatusCode.RESOURCE_EXHAUSTED.name).inc()
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.stats.in_flight} requests in flight (max_inflight {self.max_inflight}); retry later",
            )
        self.stats.in_flight += 1
        metrics.REQUESTS_RUNNING.inc()
        call = _Call(started=time.perf_counter(), capture=capture_content())
        if call.capture:
            call.prompt = request.prompt or " ".join(map(str, request.prompt_token_ids))
        attributes = {
            "rpc.system": "grpc",
            "rpc.service": SERVICE_NAME,
            "rpc.method": method,
            "gen_ai.operation.name": "text_completion",
            "gen_ai.request.model": self.model_name,
            "gen_ai.request.max_tokens": request.max_new_tokens,
            "gen_ai.request.temperature": request.sampling.temperature,
        }
        try:
            with self.tracer.start_as_current_span(
                f"{SERVICE_NAME}/{method}", kind=trace.SpanKind.SERVER, attributes=attributes
            ) as span:
                call.trace_id = _trace_id(span)
                try:
                    await _bounded(
                        asyncio.create_task(self._consume(request, on_delta, call)), context.time_remaining()
                    )
                    call.code = grpc.StatusCode.OK
                except _CallEnded:
                    call.code = grpc.StatusCode.CANCELLED
                    return  # the client cancelled or left while we wrote; grpc cancels this task next
                except InvalidArgument as e:
                    call.code = grpc.StatusCode.INVALID_ARGUMENT
                    await context.abort(call.code, str(e))
                except TimeoutError:
                    call.code = grpc.StatusCode.DEADLINE_EXCEEDED
                    await context.abort(call.code, "the deadline passed during generation")
                except TargetUnavailable as e:
                    call.code = grpc.StatusCode.UNAVAILABLE
                    await context.abort(call.code, f"target tier: {e}")
                except asyncio.CancelledError:
                    call.code = grpc.StatusCode.CANCELLED
                    raise
                except Exception as e:  # noqa: BLE001 - any other failure is the server's, not the caller's
                    log.exception("%s failed", method)
                    call.code = grpc.StatusCode.INTERNAL
                    await context.abort(call.code, f"{type(e).__name__}: {e}")
                finally:
                    span.set_attributes(call.span_attributes())
                    if call.code is not grpc.StatusCode.OK:
                        span.set_status(trace.Status(trace.StatusCode.ERROR, call.code.name))
        finally:
            self.stats.in_flight -= 1
            self.stats.requests += 1
            self.stats.failed += call.code is not grpc.StatusCode.OK
            metrics.REQUESTS_RUNNING.dec()
            metrics.REQUESTS.labels(call.finish_reason, call.code.name).inc()
            log.info("%s", call.log_line(method))

    async def _consume(self, request, on_delta: Callable[[Delta, str], Awaitable[None]], call: _Call) -> None:
        # aclosing: however the loop ends, the engine's `finally` (ending the sessions) runs now.
        async with aclosing(self.engine.stream(request_from_proto(request))) as deltas:
            async for delta in deltas:
                self._count(delta)
                call.add(delta)
                await on_delta(delta, call.trace_id)

    def _count(self, delta: Delta) -> None:
        self.stats.completion_tokens += len(delta.token_ids)
        if delta.stats is not None:
            self.stats.draft_tokens += delta.stats.draft_tokens
            self.stats.accepted_tokens += delta.stats.accepted_tokens


async def _bounded(task: asyncio.Task, timeout_s: float | None) -> None:
    """Wait for `task` (one call's engine) at most `timeout_s`. Whatever ends the wait early (the
    deadline, or this handler being cancelled) cancels the task once and waits for it to finish.

    The engine runs in a task of its own so that it is cancelled once: its `finally` ends the
    request's sessions on both tiers, and a second cancellation during those awaits would leave
    them behind until their TTL. At a deadline grpc cancels the handler at about the moment our own
    timeout fires (measured: run in the handler's task, sessions were left within a few dozen calls).
    """
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        task.cancel()
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                pass  # the handler was cancelled (again) or the task ended cancelled: loop until done
        raise


class _CallEnded(Exception):
    """A write found the call over: the client cancelled or went away between two rounds."""


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


def _trace_id(span: trace.Span) -> str:
    context = span.get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else ""  # tracing off: no id to give


class GenerationServer:
    """GenerationService, health and reflection on one port: `start`, then `stop`."""

    def __init__(
        self, engine: SpeculativeEngine, config: ServerConfig = ServerConfig(), tracer: trace.Tracer | None = None
    ):
        self.config = config
        self.servicer = GenerationServicer(engine, config.max_inflight, tracer)
        self.health = health_aio.HealthServicer()
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        _add_generation_service(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection((SERVICE_NAME, health_name, reflection.SERVICE_NAME), self.server)
        self.port = 0

    @property
    def stats(self) -> ServingStats:
        return self.servicer.stats

    async def start(self) -> int:
        """Bind and serve; returns the bound port. A busy port raises RuntimeError."""
        address = f"{self.config.host}:{self.config.port}"
        if self.config.tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            cert_chain, private_key = self.config.tls
            self.port = self.server.add_secure_port(address, grpc.ssl_server_credentials([(private_key, cert_chain)]))
        await self.server.start()
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """NOT_SERVING, refuse new calls, give calls in flight `grace_s` (default: the config's)."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.config.grace_s if grace_s is None else grace_s)
