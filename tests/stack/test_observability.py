"""One request over the real local stack (draft server subprocess, target actor on a local Ray,
coordinator over gRPC) is observable end to end: one trace across the three processes with a
round span per round, Prometheus counters that move by exactly the request's drafts, a log line
per request, and no prompt or output text anywhere."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request

import grpc
import pytest
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from specdec import cli
from specdec.cli.trace_view import render
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.server import ServerConfig
from specdec.local.stack import LocalStack, StackConfig
from specdec.telemetry.trace_file import JsonLinesSpanExporter, read_spans
from specdec.v1 import common_pb2, generation_pb2, generation_pb2_grpc

CANARY = "zebracanary"  # in the prompt: must appear in no span, no log line, no trace file line
PROMPT = f"def {CANARY}(x):\n    return {CANARY}(x) + {CANARY}(x) + {CANARY}(x)\n\ndef {CANARY}"


def scrape(address: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a /metrics page, parsed by Prometheus' own text-format parser."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def moved(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


@pytest.fixture(scope="module")
def observed(tiny_dir, ray_local, tmp_path_factory):
    """Run one greedy Generate through a local stack; return everything observed about it."""
    root = tmp_path_factory.mktemp("observe")
    trace_file = root / "traces.jsonl"
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: "specdec-coordinator"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(trace_file)))  # as `specdec up` does
    config = StackConfig(
        target_model=tiny_dir("llama", 1),
        draft_model="ngram",
        pool_name="specdec-observe",
        trace_file=str(trace_file),
        metrics_port=0,
        server=ServerConfig(port=0),
        engine=EngineConfig(default_draft_tokens=4, adaptive=False),  # every round drafts: the counters must move
    )
    logs: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logs.append(record.getMessage())
    logger = logging.getLogger("specdec.coordinator")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    async def run():
        async with LocalStack(config, tracer=provider.get_tracer("test")) as stack:
            addresses = {
                "coordinator": stack.metrics.address,
                "draft": stack.draft_metrics_address,
                "target": stack.target_metrics_addresses[0],
            }
            before = {tier: await asyncio.to_thread(scrape, a) for tier, a in addresses.items()}
            async with grpc.aio.insecure_channel(stack.address) as channel:
                request = generation_pb2.GenerateRequest(
                    prompt=PROMPT, max_new_tokens=24, sampling=common_pb2.SamplingParams(temperature=0.0)
                )
                response = await generation_pb2_grpc.GenerationServiceStub(channel).Generate(request)
            after = {tier: await asyncio.to_thread(scrape, a) for tier, a in addresses.items()}
            # The draft server and the actor write their spans in batches every 0.5 s.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                services = {s["service"] for s in read_spans(trace_file) if s["trace_id"] == response.trace_id}
                if {"specdec-draft", "specdec-target"} <= services:
                    break
                await asyncio.sleep(0.2)
            return response, before, after

    try:
        response, before, after = asyncio.run(run())
    finally:
        logger.removeHandler(handler)
    return {
        "response": response,
        "before": before,
        "after": after,
        "memory": memory.get_finished_spans(),
        "file": trace_file,
        "logs": logs,
    }


def test_one_trace_spans_all_three_tiers_with_a_round_span_per_round(observed):
    response = observed["response"]
    stats = response.speculation
    assert stats.rounds > 0 and stats.draft_tokens > 0 and len(response.trace_id) == 32
    spans = [s for s in read_spans(observed["file"]) if s["trace_id"] == response.trace_id]
    by_service = {
        service: [s for s in spans if s["service"] == service]
        for service in ("specdec-coordinator", "specdec-draft", "specdec-target")
    }
    assert all(by_service.values()), {k: len(v) for k, v in by_service.items()}

    (server,) = [s for s in by_service["specdec-coordinator"] if s["kind"] == "SERVER"]
    rounds = [s for s in spans if s["name"] == "specdec.round"]
    assert len(rounds) == stats.rounds
    assert all(r["parent_span_id"] == server["span_id"] for r in rounds)
    attributes = [r["attributes"] for r in rounds]
    assert sorted(a["specdec.round.index"] for a in attributes) == list(range(stats.rounds))
    assert sum(a["specdec.round.committed_tokens"] for a in attributes) == len(response.token_ids)
    assert sum(a["specdec.round.accepted"] for a in attributes) == stats.accepted_tokens
    assert sum(a["specdec.round.k"] for a in attributes) == stats.draft_tokens
    sources = {a["specdec.round.draft_source"] for a in attributes if a["specdec.round.k"]}
    assert sources and sources <= {"ngram", "ngram_short", "model"}
    assert all(a["specdec.round.verify_latency_ms"] > 0 and a["specdec.round.fallback"] is False for a in attributes)

    # The actor's verify span hangs under its round (W3C traceparent through Ray).
    verifies = by_service["specdec-target"]
    assert len(verifies) == stats.rounds
    assert {v["parent_span_id"] for v in verifies} <= {r["span_id"] for r in rounds}
    # The draft server's span came through gRPC metadata (OpenTelemetry's gRPC instrumentation).
    proposes = [
        s for s in by_service["specdec-draft"] if s["kind"] == "SERVER" and s["name"].endswith("DraftService/Propose")
    ]
    assert proposes and all(s["attributes"]["specdec.draft.source"] == "ngram" for s in proposes)
    assert sum(s["attributes"]["specdec.draft.tokens"] for s in proposes) >= stats.draft_tokens

    a = server["attributes"]
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.max_tokens"] == 24 and a["gen_ai.request.temperature"] == 0.0
    assert a["gen_ai.usage.input_tokens"] == response.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == len(response.token_ids)
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["gen_ai.request.model"]


def test_metrics_move_by_exactly_the_requests_drafts(observed):
    before, after, stats = observed["before"], observed["after"], observed["response"].speculation
    c_before, c_after = before["coordinator"], after["coordinator"]
    assert moved(c_before, c_after, "specdec:spec_decode_num_draft_tokens_total") == stats.draft_tokens
    assert moved(c_before, c_after, "specdec:spec_decode_num_accepted_tokens_total") == stats.accepted_tokens
    assert moved(c_before, c_after, "specdec:rounds_total") == stats.rounds
    assert (
        moved(c_before, c_after, "specdec:spec_decode_num_drafts_total") == stats.rounds - stats.non_speculative_rounds
    )
    per_position = [
        moved(c_before, c_after, "specdec:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
        for i in range(len(stats.accepted_per_position))
    ]
    assert per_position == list(stats.accepted_per_position)
    assert moved(c_before, c_after, "specdec:requests_total", finish_reason="length", code="OK") == 1
    assert moved(c_before, c_after, "specdec:time_to_first_token_seconds_count") == 1
    assert moved(c_before, c_after, "specdec:round_latency_seconds_count") == stats.rounds
    assert c_after[("specdec:requests_running", ())] == 0
    # Draft tier: every speculative round asked it once at least (plus pipelined asks).
    assert (
        moved(before["draft"], after["draft"], "specdec:draft_propose_calls_total", code="OK")
        >= stats.rounds - stats.non_speculative_rounds
    )
    # Target tier: one verified round each; the session was ended, nothing stays cached.
    assert moved(before["target"], after["target"], "specdec:target_verify_rounds_total") == stats.rounds
    assert after["target"][("specdec:target_sessions", ())] == 0
    # The KV pool: a fixed number of blocks, all free again once the session ended.
    assert after["target"][("specdec:target_kv_blocks_total", ())] > 0
    assert after["target"][("specdec:target_kv_blocks_used", ())] == 0


def test_no_prompt_or_output_text_in_spans_or_logs(observed):
    response = observed["response"]
    texts = [CANARY, response.text.strip()[:12]] if response.text.strip() else [CANARY]
    for line in observed["file"].read_text().splitlines():
        assert not any(t in line for t in texts), line
    for span in observed["memory"]:
        assert not any(t in str(v) for t in texts for v in span.attributes.values()), span.name
    request_lines = [line for line in observed["logs"] if line.startswith("request ")]
    assert len(request_lines) == 1 and f"trace_id={response.trace_id}" in request_lines[0]
    assert f"completion_tokens={len(response.token_ids)}" in request_lines[0] and "acceptance=" in request_lines[0]
    assert not any(t in line for t in texts for line in observed["logs"])


def test_specdec_trace_prints_every_round(observed, capsys):
    response = observed["response"]
    assert cli.main(["trace", response.trace_id, "--file", str(observed["file"])]) == 0
    out = capsys.readouterr().out
    for i in range(response.speculation.rounds):
        assert f"round {i}: k=" in out
    assert out.count("specdec.verify [specdec-target]") == response.speculation.rounds
    assert f"summary: {response.speculation.rounds} rounds, {len(response.token_ids)} tokens" in out
    assert cli.main(["trace", "--last", "--file", str(observed["file"])]) == 0
    assert f"trace {response.trace_id}" in capsys.readouterr().out
    assert cli.main(["trace", "0" * 32, "--file", str(observed["file"])]) == 1


def test_render_nests_children_and_marks_errors():
    def span(span_id, parent, name, start, end, **attributes):
        return {"trace_id": "t", "span_id": span_id, "parent_span_id": parent, "name": name, "service": "s",
                "kind": "INTERNAL", "start_ns": start, "end_ns": end, "status": "ERROR" if name == "bad" else "UNSET",
                "attributes": attributes}  # fmt: skip

    spans = [
        span("a", "", "specdec.v1.GenerationService/Generate", 0, 10_000_000, **{"gen_ai.operation.name": "chat"}),
        span(
            "r0",
            "a",
            "specdec.round",
            1,
            5_000_000,
            **{
                "specdec.round.index": 0,
                "specdec.round.k": 4,
                "specdec.round.accepted": 2,
                "specdec.round.committed_tokens": 3,
                "specdec.round.draft_latency_ms": 1.0,
                "specdec.round.verify_latency_ms": 3.0,
            },
        ),  # fmt: skip
        span("v", "r0", "bad", 2, 4_000_000),
    ]
    spans[0]["kind"] = "SERVER"  # the coordinator's request span
    lines = render(spans)
    assert lines[0].startswith("specdec.v1.GenerationService/Generate")
    assert lines[1].startswith("└─ round 0: k=4 accepted 2 -> 3 tokens")
    assert lines[2].startswith("   └─ bad") and lines[2].endswith("ERROR")
    assert (
        lines[-1].startswith("summary: 1 rounds, 3 tokens, acceptance 50% (2/4)")
        and "draft 10%, verify 30%" in lines[-1]
    )


def test_content_reaches_the_span_only_when_the_operator_turns_it_on(monkeypatch):
    from specdec.coordinator.calls import Call, capture_content
    from specdec.coordinator.engine import Delta

    assert not capture_content()
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    assert capture_content()
    for capture in (False, True):
        call = Call(started=0.0, capture=capture, prompt="the prompt" if capture else "")
        call.add(Delta([7], "an answer"))
        attributes = call.span_attributes()
        assert (attributes.get("gen_ai.prompt"), attributes.get("gen_ai.completion")) == (
            ("the prompt", "an answer") if capture else (None, None)
        )
        assert "an answer" not in call.log_line("Generate")
