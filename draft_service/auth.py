"""Bearer-token checks for the gRPC servers: the draft tier's `--auth-token`, and the public API's
`--api-key` (the coordinator uses the same interceptor). Health checks are always exempt, so
probes and balancers need no secret."""

from __future__ import annotations

import hmac

import grpc
from grpc_health.v1 import health_pb2

HEALTH_METHODS = f"/{health_pb2.DESCRIPTOR.services_by_name['Health'].full_name}/"


def bearer_matches(header: str | bytes | None, token: str) -> bool:
    """Whether an `authorization` value is `Bearer <token>`, compared in constant time."""
    given = header.encode() if isinstance(header, str) else (header or b"")
    return hmac.compare_digest(given, f"Bearer {token}".encode())


class BearerAuth(grpc.aio.ServerInterceptor):
    """Refuses every call but health checks with UNAUTHENTICATED unless its metadata carries
    `authorization: Bearer <token>`."""

    def __init__(self, token: str, message: str = "missing or wrong bearer token"):
        self._token = token
        self._message = message

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_METHODS):
            return handler
        given = next((value for key, value in details.invocation_metadata or () if key == "authorization"), None)
        if bearer_matches(given, self._token):
            return handler
        message = self._message

        async def refuse(request, context: grpc.aio.ServicerContext):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        # The refusal takes the handler's shape; its request stays unparsed bytes.
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)
