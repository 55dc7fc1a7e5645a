"""One call of the public API, whatever its transport: admission, the server span, the deadline,
the metrics and the log line, around the engine.

The gRPC service (server.py) and the OpenAI-compatible HTTP API (http_api.py) both run every
request through `Calls.run`, so a request gets the same validation, deadline, cancellation, span
and counters on either. A failure leaves as `CallFailed` with a gRPC status code: those are the
canonical codes, which the HTTP API maps onto HTTP statuses and the metrics label calls with.
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
from opentelemetry import context as otel_context
from opentelemetry import trace

from specdec.coordinator import metrics
from specdec.coordinator.engine import Delta, GenerationRequest, SpeculationStats, SpeculativeEngine
from specdec.core.errors import InvalidArgument
from specdec.target_service.pool import TargetOverloaded, TargetUnavailable

log = logging.getLogger(__name__)

# on_delta(delta, trace_id): hands one round's output to the transport.
OnDelta = Callable[[Delta, str], Awaitable[None]]


class CallFailed(Exception):
    """The call ended with `code` (never OK or CANCELLED). An invalid request names its `field`
    (the engine's name) and says what is wrong with it in `detail`."""

    def __init__(self, code: grpc.StatusCode, message: str, field: str | None = None, detail: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.detail = detail


class CallEnded(Exception):
    """Raised by a transport's `on_delta`: the client cancelled or went away between two rounds."""


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
class Call:
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
    delivered: bool = False  # the final delta went out: the client has its whole answer
    admitted: bool = True  # counted in `max_inflight` (until its last delta is handed over)
    on_last_delta: Callable[[Call], None] | None = None

    def add(self, delta: Delta) -> None:
        self.completion_tokens += len(delta.token_ids)
        if self.capture:
            self.completion.append(delta.text)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason.value
            self.prompt_tokens = delta.prompt_tokens
            self.stats = delta.stats
            metrics.PROMPT_TOKENS.inc(delta.prompt_tokens)
            if self.on_last_delta is not None:
                self.on_last_delta(self)

    def span_attributes(self) -> dict:
        attributes = {"gen_ai.usage.output_tokens": self.completion_tokens}
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


@dataclass(frozen=True)
class CallSpan:
    """How a transport names its calls in the trace: the span's name, its own attributes, and the
    attributes of a call's final status code."""

    name: str
    attributes: dict
    status_attributes: Callable[[grpc.StatusCode], dict]
    parent: otel_context.Context | None = None  # a caller's propagated trace context


class Calls:
    """Every public call of one coordinator: admission beyond `max_inflight`, then the engine."""

    def __init__(self, engine: SpeculativeEngine, max_inflight: int, tracer: trace.Tracer | None = None):
        self.model_name = getattr(getattr(engine, "target", None), "name", "")  # LoadedModel and RemoteTarget name it
        self.engine = engine
        self.max_inflight = max_inflight
        metrics.MAX_INFLIGHT.set(max_inflight)
        self.tracer = tracer or trace.get_tracer("specdec.coordinator")
        self.stats = ServingStats()

    async def run(
        self,
        request: GenerationRequest,
        method: str,
        span: CallSpan,
        timeout_s: float | None,
        on_delta: OnDelta,
        call_id: str | None = None,
    ) -> Call:
        """Feed the engine's deltas for `request` to `on_delta`, under admission, a server span and
        the deadline `timeout_s` (None: none). Returns the finished call, whose code is OK, or
        CANCELLED when `on_delta` raised `CallEnded`; raises `CallFailed` for every other end, and
        CancelledError when the caller's task is cancelled (the engine's sessions ended first)."""
        call = self._admit(request, call_id)
        try:
            with self.tracer.start_as_current_span(
                span.name, context=span.parent, kind=trace.SpanKind.SERVER, attributes=self._attributes(request, span)
            ) as server_span:
                call.trace_id = trace_id(server_span)
                try:
                    await self._generate(request, method, timeout_s, on_delta, call)
                finally:
                    server_span.set_attributes({**call.span_attributes(), **span.status_attributes(call.code)})
                    if call.code is not grpc.StatusCode.OK:
                        server_span.set_status(trace.Status(trace.StatusCode.ERROR, call.code.name))
        finally:
            self._finish(call, method)
        return call

    def _admit(self, request: GenerationRequest, call_id: str | None) -> Call:
        """The call, counted in flight; `CallFailed` (RESOURCE_EXHAUSTED) beyond `max_inflight`."""
        if self.stats.in_flight >= self.max_inflight:
            metrics.REQUESTS.labels("", grpc.StatusCode.RESOURCE_EXHAUSTED.name).inc()
            raise CallFailed(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.stats.in_flight} requests in flight (max_inflight {self.max_inflight}); retry later",
            )
        self.stats.in_flight += 1
        metrics.REQUESTS_RUNNING.inc()
        call = Call(started=time.perf_counter(), capture=capture_content(), on_last_delta=self._leave)
        if call_id is not None:
            call.id = call_id  # the transport's id for the request (the HTTP API's x-request-id)
        if call.capture:
            call.prompt = (
                request.prompt
                or "\n".join(f"{m.role}: {m.content}" for m in request.messages)
                or " ".join(map(str, request.prompt_token_ids))
            )
        return call

    def _attributes(self, request: GenerationRequest, span: CallSpan) -> dict:
        """The server span's attributes at its start: the transport's, and the request's."""
        attributes = {
            **span.attributes,
            "gen_ai.operation.name": "chat" if request.messages else "text_completion",
            "gen_ai.request.model": self.model_name,
            "gen_ai.request.temperature": request.sampling.temperature,
        }
        if request.max_new_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_new_tokens
        return attributes

    async def _generate(
        self, request: GenerationRequest, method: str, timeout_s: float | None, on_delta: OnDelta, call: Call
    ) -> None:
        """Run the engine for `call` within the deadline; set its code from how it ended, and turn
        every end but OK, CANCELLED and the caller's cancellation into `CallFailed`."""
        try:
            await _bounded(
                asyncio.create_task(self._consume(request, on_delta, call)), timeout_s, lambda: call.delivered
            )
            call.code = grpc.StatusCode.OK
        except CallEnded:
            call.code = grpc.StatusCode.CANCELLED  # the client left while we wrote
        except InvalidArgument as e:
            call.code = grpc.StatusCode.INVALID_ARGUMENT
            raise CallFailed(call.code, str(e), e.field, e.message) from e
        except TimeoutError as e:
            call.code = grpc.StatusCode.DEADLINE_EXCEEDED
            raise CallFailed(call.code, "the deadline passed during generation") from e
        except TargetUnavailable as e:
            call.code = grpc.StatusCode.UNAVAILABLE
            raise CallFailed(call.code, f"target tier: {e}") from e
        except TargetOverloaded as e:
            call.code = grpc.StatusCode.RESOURCE_EXHAUSTED
            raise CallFailed(call.code, f"target tier: {e}") from e
        except asyncio.CancelledError:
            call.code = grpc.StatusCode.CANCELLED
            raise
        except Exception as e:  # any other failure is the server's, not the caller's
            log.exception("%s failed", method)
            call.code = grpc.StatusCode.INTERNAL
            raise CallFailed(call.code, f"{type(e).__name__}: {e}") from e

    def _finish(self, call: Call, method: str) -> None:
        """The call's end, whatever it was: out of admission, counted, and its log line."""
        self._leave(call)
        self.stats.requests += 1
        self.stats.failed += call.code is not grpc.StatusCode.OK
        metrics.REQUESTS.labels(call.finish_reason, call.code.name).inc()
        log.info("%s", call.log_line(method))

    async def _consume(self, request: GenerationRequest, on_delta: OnDelta, call: Call) -> None:
        waiting = True  # until the first round's tokens: vLLM's "waiting" (the autoscalers' signal)
        metrics.REQUESTS_WAITING.inc()
        try:
            # aclosing: however the loop ends, the engine's `finally` (ending the sessions) runs now.
            async with aclosing(self.engine.stream(request)) as deltas:
                async for delta in deltas:
                    if waiting:
                        waiting = False
                        metrics.REQUESTS_WAITING.dec()
                    self._count(delta)
                    call.add(delta)  # the last delta leaves admission before it is sent
                    await on_delta(delta, call.trace_id)
                    call.delivered = delta.finish_reason is not None
        finally:
            if waiting:
                metrics.REQUESTS_WAITING.dec()

    def _leave(self, call: Call) -> None:
        """The call leaves `max_inflight`, once: as its last delta goes to the transport, or when it
        ends without one. The client may open its next stream the moment it reads the last chunk,
        while this call still ends its sessions on both tiers; counting that cleanup as in flight
        would refuse a client that never holds more than `max_inflight` streams open."""
        if call.admitted:
            call.admitted = False
            self.stats.in_flight -= 1
            metrics.REQUESTS_RUNNING.dec()

    def _count(self, delta: Delta) -> None:
        self.stats.completion_tokens += len(delta.token_ids)
        if delta.stats is not None:
            self.stats.draft_tokens += delta.stats.draft_tokens
            self.stats.accepted_tokens += delta.stats.accepted_tokens


async def _bounded(task: asyncio.Task, timeout_s: float | None, delivered: Callable[[], bool]) -> None:
    """Wait for `task` (one call's engine) at most `timeout_s`. Whatever ends the wait early (the
    deadline, or this handler being cancelled) cancels the task once and waits for it to finish.

    The engine runs in a task of its own so that it is cancelled once: its `finally` ends the
    request's sessions on both tiers, and a second cancellation during those awaits would leave
    them behind until their TTL. At a deadline grpc cancels the handler at about the moment our own
    timeout fires (measured: run in the handler's task, sessions were left within a few dozen calls).

    The deadline bounds the generation: once every token was delivered (`delivered()`, the final
    delta went out), the client has its answer, and a deadline passing while the sessions end
    fails nothing; the task finishes its cleanup uncut.
    """
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout_s)
        return
    except TimeoutError:
        if not delivered():
            await _cancel_and_wait(task)
            raise
    except asyncio.CancelledError:
        await _cancel_and_wait(task)
        raise
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:  # the handler was cancelled meanwhile: the cleanup still runs out
        await _cancel_and_wait(task)
        raise


async def _cancel_and_wait(task: asyncio.Task) -> None:
    task.cancel()
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            pass  # the handler was cancelled (again) or the task ended cancelled: loop until done
        except Exception:
            pass  # the task's own failure: the caller raises what ended the wait


def trace_id(span: trace.Span) -> str:
    context = span.get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else ""  # tracing off: no id to give
