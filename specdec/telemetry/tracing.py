"""Tracing set-up for one process, from the standard OTEL_* environment variables.

Each process (coordinator, draft server, every Ray actor) installs its own tracer provider, so
spans are exported from where they happen and joined into one trace by propagated context.
Export is OTLP when an endpoint is configured (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_EXPORTER_OTLP_PROTOCOL picks grpc or http/protobuf),
through a batching processor so a round never waits on the network; OTEL_TRACES_SAMPLER sets
sampling (the SDK reads it), OTEL_SDK_DISABLED=true turns tracing off. A trace file (`file`, or
SPECDEC_TRACE_FILE) gets every finished span as a JSON line (specdec/telemetry/trace_file.py).
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TRACE_FILE_ENV = "SPECDEC_TRACE_FILE"


def _otlp_exporter():
    if os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    ).startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def configure_tracing(
    service_name: str, *, memory: bool = False, file: str | None = None
) -> InMemorySpanExporter | None:
    """Install this process's tracer provider; returns an in-memory exporter when `memory` (tests)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", service_name)})
    )
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
    file = file or os.environ.get(TRACE_FILE_ENV)
    if file:
        from specdec.telemetry.trace_file import JsonLinesSpanExporter

        # Half a second, not the default five: `specdec trace --last` right after a request, and
        # an actor killed without exit handlers, lose at most that much.
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(file), schedule_delay_millis=500))
    exporter = None
    if memory:
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter
