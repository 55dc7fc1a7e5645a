"""`specdec trace`: one request's spans from the local trace file, as a tree of rounds.

The coordinator's server span is the root; under it one `specdec.round` span per round, and
under each round the draft service's Propose span and the target actor's verify span (their
processes joined the trace through gRPC metadata and a W3C traceparent carrier).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from specdec.runtime.models import cache_dir
from specdec.telemetry.trace_file import read_spans


def is_request(span: dict) -> bool:
    """A coordinator's span of one public call: gRPC (`specdec.v1.GenerationService/...`) or
    HTTP (`POST /v1/completions`, ...), the server spans that carry the GenAI operation."""
    return span["kind"] == "SERVER" and "gen_ai.operation.name" in span["attributes"]


def default_trace_file() -> Path:
    return cache_dir() / "traces.jsonl"


def last_trace_id(spans: Iterable[dict]) -> str | None:
    """The trace of the request that finished last."""
    requests = [s for s in spans if is_request(s)]
    return max(requests, key=lambda s: s["end_ns"])["trace_id"] if requests else None


def _ms(span: dict) -> float:
    return (span["end_ns"] - span["start_ns"]) / 1e6


def _label(span: dict) -> str:
    a = span["attributes"]
    if span["name"] == "specdec.round":
        flags = [name for name in ("pipelined", "fallback") if a.get(f"specdec.round.{name}")]
        return (
            f"round {a.get('specdec.round.index')}: k={a.get('specdec.round.k', 0)} "
            f"accepted {a.get('specdec.round.accepted', 0)}{' +bonus' if a.get('specdec.round.bonus') else ''} "
            f"-> {a.get('specdec.round.committed_tokens', 0)} tokens | "
            f"draft {a.get('specdec.round.draft_latency_ms', 0):.1f} ms, "
            f"verify {a.get('specdec.round.verify_latency_ms', 0):.1f} ms"
            f"{' [' + ', '.join(flags) + ']' if flags else ''}"
        )
    detail = ""
    if is_request(span):
        detail = (
            f" | in {a.get('gen_ai.usage.input_tokens', '?')} out {a.get('gen_ai.usage.output_tokens', '?')} tokens, "
            f"finish {','.join(a.get('gen_ai.response.finish_reasons', [])) or '-'}, "
            f"model {a.get('gen_ai.request.model', '?')}"
        )
    elif span["name"] == "specdec.verify":
        detail = (
            f" | batch {a.get('specdec.batch_size', '?')}, k={a.get('specdec.k', '?')}, "
            f"accepted {a.get('specdec.num_accepted', '?')}"
        )
    status = "" if span["status"] != "ERROR" else " ERROR"
    return f"{span['name']} [{span['service']}] {_ms(span):.1f} ms{detail}{status}"


def render(spans: list[dict]) -> list[str]:
    """The tree of one trace's spans, then the one-line summary."""
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict]] = defaultdict(list)
    for s in spans:
        children[s["parent_span_id"] if s["parent_span_id"] in ids else ""].append(s)
    for group in children.values():
        group.sort(key=lambda s: s["start_ns"])
    lines = []

    def walk(span: dict, prefix: str, last: bool, root: bool) -> None:
        lines.append(f"{prefix}{'' if root else ('└─ ' if last else '├─ ')}{_label(span)}")
        below = children.get(span["span_id"], [])
        inner = prefix + ("" if root else ("   " if last else "│  "))
        for i, child in enumerate(below):
            walk(child, inner, i == len(below) - 1, False)

    for root in children[""]:
        walk(root, "", True, True)
    lines.append(summary(spans))
    return lines


def summary(spans: list[dict]) -> str:
    rounds = [s["attributes"] for s in spans if s["name"] == "specdec.round"]
    requests = [s for s in spans if is_request(s)]
    if not rounds:
        return "summary: no rounds in this trace"
    drafted = sum(r.get("specdec.round.k", 0) for r in rounds)
    accepted = sum(r.get("specdec.round.accepted", 0) for r in rounds)
    committed = sum(r.get("specdec.round.committed_tokens", 0) for r in rounds)
    draft_ms = sum(r.get("specdec.round.draft_latency_ms", 0.0) for r in rounds)
    verify_ms = sum(r.get("specdec.round.verify_latency_ms", 0.0) for r in rounds)
    total_ms = max(_ms(requests[0]) if requests else draft_ms + verify_ms, 1e-6)
    other_ms = max(0.0, total_ms - draft_ms - verify_ms)
    acceptance = f"{accepted / drafted:.0%} ({accepted}/{drafted})" if drafted else "- (no drafts)"
    return (
        f"summary: {len(rounds)} rounds, {committed} tokens, acceptance {acceptance}, "
        f"mean accepted length {committed / len(rounds):.2f} tokens per round | "
        f"time {total_ms:.0f} ms: draft {draft_ms / total_ms:.0%}, verify {verify_ms / total_ms:.0%}, "
        f"coordination {other_ms / total_ms:.0%}"
    )


def show(trace_id: str | None, path: Path, last: bool) -> tuple[int, list[str]]:
    """(exit status, lines to print) for `specdec trace`."""
    if not path.exists():
        return 1, [f"no trace file at {path}: `specdec up` writes one (or pass --file)"]
    spans = list(read_spans(path))
    if last:
        trace_id = last_trace_id(spans)
        if trace_id is None:
            return 1, [f"no request in {path} yet"]
    trace_id = (trace_id or "").strip().lower()
    mine = [s for s in spans if s["trace_id"] == trace_id]
    if not mine:
        return 1, [f"trace {trace_id} is not in {path} (its spans reach the file within a second of the request's end)"]
    return 0, [f"trace {trace_id}"] + render(mine)
