"""Telemetry in one place: OpenTelemetry tracing set-up, the trace file, and the Prometheus
metrics server every service runs."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "configure_tracing": "tracing",
    "TRACE_FILE_ENV": "tracing",
    "JsonLinesSpanExporter": "trace_file",
    "read_spans": "trace_file",
    "MetricsServer": "metrics",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
