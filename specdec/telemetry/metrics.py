"""Prometheus metrics: the endpoint every service serves, and the buckets the tiers share.

Each tier defines its own metrics once per process (coordinator/metrics.py,
draft_service/metrics.py, target_service/metrics.py) in the default registry, under the
`specdec:` prefix; counters in the names users of speculative decoding already chart (vLLM's
`spec_decode_*`). Several servers in one process (tests, benchmarks) add into the same series.
"""

from __future__ import annotations

import errno

from prometheus_client import start_http_server

# Seconds, from a fast RPC to a long request; a decode step (a GPU's or a CPU's) falls mid-range.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class MetricsServer:
    """GET /metrics (and /) in the Prometheus text format, from a daemon thread."""

    def __init__(self, host: str, port: int, search: int = 1):
        """Bind `port` on `host`, or the next free one of `search` ports from there (0: any)."""
        for candidate in range(port, port + max(search, 1)) if port else (0,):
            try:
                self._server, self._thread = start_http_server(candidate, addr=host)
                break
            except OSError as error:
                if error.errno != errno.EADDRINUSE or candidate == port + search - 1:
                    raise
        self.host = host
        self.port: int = self._server.server_port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
