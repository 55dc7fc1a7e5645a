"""The OpenAI-compatible HTTP API, in the coordinator's process beside gRPC (Starlette on uvicorn).

POST /v1/completions and /v1/chat/completions (whole or as server-sent events ending with
`data: [DONE]`), GET /v1/models and GET /health. Every generation runs through the same `Calls`
as the gRPC API (calls.py): the same validation, admission, deadline, spans and metrics. Status
codes follow the gRPC code the call ended with: 400 INVALID_ARGUMENT, 404 an unknown model, 429
RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500 otherwise; errors are OpenAI's
error JSON. A failure before the first token is the response's status; after it (the stream's
200 is sent), an `error` event ends the stream. A client that disconnects cancels its generation:
the engine ends both tiers' sessions. The deadline is the `x-request-timeout` header (seconds),
when sent. Every answer carries `x-request-id`; generations also `x-trace-id`, the trace's id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import uvicorn
from opentelemetry import propagate
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from specdec.coordinator import metrics
from specdec.coordinator import openai_protocol as oai
from specdec.coordinator.calls import CallFailed, Calls, CallSpan
from specdec.coordinator.engine import Delta
from specdec.core.errors import InvalidArgument
from specdec.draft_service.auth import bearer_matches

log = logging.getLogger(__name__)

# As the gRPC port's limit: a prompt as long as any model's context is far below it.
MAX_BODY_BYTES = 16 << 20
TIMEOUT_HEADER = "x-request-timeout"

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "overloaded_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
}


class HttpApi:
    """The ASGI application (`app`) over one coordinator's `Calls`."""

    def __init__(self, calls: Calls, served_model: str, max_context: int, api_key: str | None = None):
        self.calls = calls
        self.api_key = api_key  # every /v1 route wants `Authorization: Bearer <api_key>`; /health never
        self.served_model = served_model
        self.max_context = max_context
        self.serving = True  # False from the start of a stop: /health answers 503
        self.started = int(time.time())
        self._running: set[asyncio.Task] = set()  # the generations' tasks
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
            ]
        )

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.serving else 503)

    def _refused(self, request: Request) -> Response | None:
        """401, as OpenAI's API answers a missing or wrong key, or None when the call may go on."""
        if self.api_key is None or bearer_matches(request.headers.get("authorization"), self.api_key):
            return None
        metrics.REQUESTS.labels("", grpc.StatusCode.UNAUTHENTICATED.name).inc()
        body = oai.error_body("missing or wrong API key", "invalid_request_error", code="invalid_api_key")
        return JSONResponse(body, 401, {"www-authenticate": "Bearer"})

    async def models(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        model = {"id": self.served_model, "object": "model", "created": self.started, "owned_by": "specdec"}
        model["max_model_len"] = self.max_context
        return JSONResponse({"object": "list", "data": [model]})

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, oai.COMPLETIONS, "cmpl-")

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, oai.CHAT, "chatcmpl-")

    async def _generate(self, request: Request, kind: str, id_prefix: str) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        call_id = uuid.uuid4().hex
        headers = {"x-request-id": call_id}
        try:
            parsed = oai.parse(kind, await _json_body(request), self.served_model)
            timeout_s = _timeout(request.headers.get(TIMEOUT_HEADER))
        except InvalidArgument as e:
            metrics.REQUESTS.labels("", grpc.StatusCode.INVALID_ARGUMENT.name).inc()  # as gRPC's unparsable requests
            return _error(grpc.StatusCode.INVALID_ARGUMENT, str(e), e.field, headers)
        except oai.ModelNotFound as e:
            metrics.REQUESTS.labels("", grpc.StatusCode.NOT_FOUND.name).inc()
            return _error(grpc.StatusCode.NOT_FOUND, str(e), "model", headers, "model_not_found")
        except _BodyTooLarge as e:
            metrics.REQUESTS.labels("", grpc.StatusCode.RESOURCE_EXHAUSTED.name).inc()  # as gRPC's message limit
            return JSONResponse(oai.error_body(str(e), "invalid_request_error"), 413, headers)
        path = request.url.path
        span = CallSpan(
            f"POST {path}",
            {"http.request.method": "POST", "url.path": path},
            lambda code: {"http.response.status_code": _http_status(code)[0]},
            propagate.extract(request.headers),
        )
        generation = _Generation(self.calls, path, parsed, span, timeout_s, call_id)
        self._running.add(generation.task)  # a reference: the run may outlive the response by its cleanup
        generation.task.add_done_callback(self._running.discard)
        watcher = asyncio.create_task(_cancel_on_disconnect(request.receive, generation))
        try:
            first = await generation.next()
        except CallFailed as e:
            watcher.cancel()
            return _failed(e, parsed, headers)
        except asyncio.CancelledError:  # the server is stopping past its grace period
            watcher.cancel()
            generation.cancel()
            raise
        if first is None:  # the client left before the first token: nobody reads an answer
            watcher.cancel()
            return Response(status_code=499, headers=headers)
        headers["x-trace-id"] = first[1]
        reply = oai.Reply(kind, id_prefix + call_id, self.served_model, return_token_ids=parsed.return_token_ids)
        if parsed.stream:
            return _EventStream(_events(generation, parsed, reply, first[0]), generation, watcher, headers)
        try:
            return await _whole(generation, parsed, reply, first[0], headers)
        except asyncio.CancelledError:
            generation.cancel()
            raise
        finally:
            watcher.cancel()


class _Generation:
    """One request's run through `Calls`, in a task of its own; `next` reads its deltas."""

    def __init__(
        self, calls: Calls, method: str, parsed: oai.HttpRequest, span: CallSpan, timeout_s: float | None, call_id: str
    ):
        self.deltas: asyncio.Queue = asyncio.Queue()  # (delta, trace id) ..., then None: the end
        self.task = asyncio.create_task(
            calls.run(parsed.generation, method, span, timeout_s, self._put, call_id=call_id)
        )
        self.task.add_done_callback(lambda _: self.deltas.put_nowait(None))

    async def _put(self, delta: Delta, trace_id: str) -> None:
        self.deltas.put_nowait((delta, trace_id))

    async def next(self) -> tuple[Delta, str] | None:
        """The next (delta, trace id); None once the run ended well or cancelled; raises its
        CallFailed."""
        item = await self.deltas.get()
        if item is None:
            self.deltas.put_nowait(None)  # every later read sees the end too
            if not self.task.cancelled():
                self.task.result()  # raises the run's CallFailed
        return item

    def cancel(self) -> None:
        self.task.cancel()

    async def finished(self) -> None:
        """Wait for the run to end, however it ends."""
        try:
            await asyncio.shield(self.task)
        except (asyncio.CancelledError, CallFailed):
            pass


async def _whole(
    generation: _Generation, parsed: oai.HttpRequest, reply: oai.Reply, delta: Delta, headers: dict
) -> Response:
    token_ids, texts = list(delta.token_ids), [delta.text]
    try:
        while delta.finish_reason is None:
            item = await generation.next()
            if item is None:
                return Response(status_code=499, headers=headers)  # cancelled: the client left
            delta = item[0]
            token_ids.extend(delta.token_ids)
            texts.append(delta.text)
    except CallFailed as e:
        return _failed(e, parsed, headers)
    final = Delta(token_ids, "".join(texts), delta.finish_reason, delta.prompt_tokens, delta.stats)
    return JSONResponse(reply.whole(final), headers=headers)


async def _events(
    generation: _Generation, parsed: oai.HttpRequest, reply: oai.Reply, delta: Delta
) -> AsyncIterator[bytes]:
    """The stream's events: the chunks, the usage chunk when asked for, then [DONE]; a failure
    after the first token is an `error` event."""
    completion_tokens, first = 0, True
    try:
        while True:
            completion_tokens += len(delta.token_ids)
            # A delta with no text yet (held back, or special tokens) is sent only when the client
            # asked for token ids: then its tokens are news.
            if delta.text or first or delta.finish_reason is not None or (reply.return_token_ids and delta.token_ids):
                yield _event(reply.chunk(delta, first=first and parsed.kind == oai.CHAT))
                first = False
            if delta.finish_reason is not None:
                if parsed.include_usage:
                    yield _event(reply.usage_chunk(delta, completion_tokens))
                break
            item = await generation.next()
            if item is None:
                return  # cancelled: the client left
            delta = item[0]
    except CallFailed as e:
        yield _event(_failure(e, parsed)[1])
    yield b"data: [DONE]\n\n"


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class _EventStream(Response):
    """Server-sent events from `events`. The generation is cancelled if the client disconnects
    (the watcher) or the response cannot be sent; the watcher stops with the response."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], generation: _Generation, watcher: asyncio.Task, headers: dict):
        self.events = events
        self.generation = generation
        self.watcher = watcher
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, "cache-control": "no-cache"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            sent = True
        finally:
            self.watcher.cancel()
            # Sent whole, the generation is ending on its own (the engine ends both tiers'
            # sessions after its last delta): cancelling it would fail a finished call.
            if not sent:
                self.generation.cancel()
                await self.generation.finished()


async def _cancel_on_disconnect(receive: Receive, generation: _Generation) -> None:
    """Wait for the client to go away (the request body is read by now), then cancel."""
    while (await receive())["type"] != "http.disconnect":
        pass
    generation.cancel()


class _BodyTooLarge(Exception):
    pass


async def _json_body(request: Request):
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _BodyTooLarge(f"the request body exceeds {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidArgument("body", f"is not valid JSON: {e}") from e


def _timeout(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise InvalidArgument(TIMEOUT_HEADER, f"must be a positive number of seconds, got {value!r}")
    return seconds


def _http_status(code: grpc.StatusCode) -> tuple[int, str]:
    """(HTTP status, OpenAI error type) of a call's end; 499 (nginx's): the client left first."""
    if code is grpc.StatusCode.OK:
        return 200, ""
    if code is grpc.StatusCode.CANCELLED:
        return 499, "cancelled"
    return _HTTP_STATUS.get(code, (500, "server_error"))


def _failure(e: CallFailed, parsed: oai.HttpRequest) -> tuple[int, dict]:
    """A failed call's (HTTP status, error JSON); an invalid field is named as the request named it."""
    status, kind = _http_status(e.code)
    if e.field is None:
        return status, oai.error_body(e.message, kind)
    param = parsed.http_param(e.field)
    return status, oai.error_body(f"{param}: {e.detail}", kind, param)


def _failed(e: CallFailed, parsed: oai.HttpRequest, headers: dict) -> Response:
    status, body = _failure(e, parsed)
    return JSONResponse(body, status, headers)


def _error(
    code: grpc.StatusCode, message: str, param: str | None, headers: dict, error_code: str | None = None
) -> Response:
    status, kind = _http_status(code)
    return JSONResponse(oai.error_body(message, kind, param, error_code), status, headers)


class _Server(uvicorn.Server):
    """uvicorn in a loop it does not own: the coordinator handles the process's signals."""

    def capture_signals(self):
        return _NoSignals()


class _NoSignals:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


class HttpServer:
    """`HttpApi` on `host:port` (0 picks a free one): `start`, then `stop`. With `tls`
    (certificate chain PEM, private key PEM), HTTPS with the gRPC port's certificate."""

    def __init__(self, api: HttpApi, host: str, port: int, grace_s: float, tls: tuple[bytes, bytes] | None = None):
        self.api = api
        self.host, self.port = host, port
        self.grace_s = grace_s
        self.tls = tls
        self._server: _Server | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        """Bind and serve; returns the bound port. A busy port raises OSError."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that name it, and
        # without it a response's second write waits out the client's delayed-ACK timer (Nagle's
        # algorithm), once a request on a kept-alive connection.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.api.app, lifespan="off", log_level="warning", access_log=False,
            timeout_graceful_shutdown=self.grace_s,
        )  # fmt: skip
        config.load()
        if self.tls is not None:
            config.ssl = _ssl_context(*self.tls)  # uvicorn serves the sockets it is given with this
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """503 on /health, refuse new connections, give requests in flight `grace_s` (default:
        the server's)."""
        self.api.serving = False
        if self._server is not None and self._task is not None:
            if grace_s is not None:
                self._server.config.timeout_graceful_shutdown = grace_s
            self._server.should_exit = True
            await self._task
            self._server = self._task = None


def _ssl_context(cert_chain: bytes, private_key: bytes) -> ssl.SSLContext:
    """A TLS server context from PEM bytes (Python's ssl loads them from files only: a private
    temporary directory holds them for the moment it reads them)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as directory:
        cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        cert.write_bytes(cert_chain)
        key.touch(mode=0o600)
        key.write_bytes(private_key)
        context.load_cert_chain(cert, key)
    return context
