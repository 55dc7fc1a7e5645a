"""What both ends of the tiers' gRPC connections agree on, as plain data (no grpc import).

The coordinator and the draft tier are siblings that may not import each other: the options of
their servers and of the draft client's channels, the draft protocol's message limits and its
session-miss prefix are defined here, once, for both.
"""

from __future__ import annotations

# The draft tier's FAILED_PRECONDITION message starts with this when a replica no longer holds the
# context a Propose builds on; the client then resends the whole context, once.
SESSION_MISS = "session miss"

# A ProposeRequest carries token ids: a context at most.
MAX_PROPOSE_REQUEST_BYTES = 16 << 20
# A ProposeResponse may carry dense fp32 q, 1 MiB per draft token over Gemma 3's vocabulary: far
# above gRPC's 4 MiB default, so the client accepts what the server may send.
MAX_PROPOSE_RESPONSE_BYTES = 256 << 20

Options = tuple[tuple[str, int], ...]

# Clients ping idle connections (the draft client every 30 s); a server must allow pings at least
# that often, or it answers GOAWAY "too_many_pings" (grpc's default minimum interval is 5 minutes).
_SERVER_CONNECTION: Options = (
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),  # a second server on a busy port fails instead of sharing it
)


def server_options(max_receive_bytes: int, max_send_bytes: int) -> Options:
    """Options of a grpc.aio server: the message limits given, then keepalive and port sharing."""
    return (
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", max_send_bytes),
        *_SERVER_CONNECTION,
    )


def channel_options(
    *,
    keepalive_time_s: float,
    keepalive_timeout_s: float,
    max_receive_bytes: int,
    max_send_bytes: int,
    reconnect_backoff_s: tuple[float, float],
) -> Options:
    """Options of a client channel: pings on idle connections every `keepalive_time_s` (at least the
    servers' 10 s minimum), the message limits given, reconnect backoff from first to largest."""
    first_ms, largest_ms = (int(s * 1000) for s in reconnect_backoff_s)
    return (
        ("grpc.keepalive_time_ms", int(keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", max_send_bytes),
        ("grpc.initial_reconnect_backoff_ms", first_ms),
        ("grpc.min_reconnect_backoff_ms", first_ms),
        ("grpc.max_reconnect_backoff_ms", largest_ms),
    )
