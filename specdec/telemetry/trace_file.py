"""The local trace file: finished spans of every process as JSON lines, and reading them back.

`specdec up` points every part it starts at one file (SPECDEC_TRACE_FILE for the draft server,
ActorConfig.trace_file for the target actors, the coordinator in its own process), so a request's
spans from all three tiers land in one place without a collector. Each span is one line written
with a single append, so processes writing at once never interleave within a line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from opentelemetry.sdk.resources import SERVICE_NAME
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict:
    return {
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else "",
        "name": span.name,
        "service": span.resource.attributes.get(SERVICE_NAME, ""),
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": {
            key: list(value) if isinstance(value, tuple) else value for key, value in (span.attributes or {}).items()
        },
    }


class JsonLinesSpanExporter(SpanExporter):
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            for span in spans:
                os.write(self._fd, (json.dumps(span_record(span), separators=(",", ":")) + "\n").encode())
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def read_spans(path: str | Path) -> Iterator[dict]:
    """Every span in the file; a line cut short by a process killed mid-write is skipped."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
