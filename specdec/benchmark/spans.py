"""Each request's rounds, read back from the trace file every tier of the benchmark writes.

The coordinator's `specdec.round` span says what a round drafted, accepted and committed and how
long the engine waited for drafts and for verification; the target actor's `specdec.verify`
span under it says how long the forward pass itself took; the draft server's Propose spans say
what drafting cost. Together they give the per-round time split and the inputs of the ideal
(ideal.py) without any clock of the benchmark's own.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from specdec.telemetry.trace_file import read_spans

_PROPOSE = "/specdec.v1.DraftService/Propose"


@dataclass
class Round:
    index: int
    k: int  # draft tokens verified
    accepted: int
    committed: int
    start_ns: int
    end_ns: int
    draft_wait_ms: float  # the engine waiting for this round's proposal (what pipelining did not hide)
    verify_wait_ms: float  # the engine waiting for verification: transport, queueing, the pass
    verify_compute_ms: float | None  # the target actor's forward pass for this round (None: span lost)


@dataclass
class Request:
    trace_id: str
    rounds: list[Round]
    draft_compute_ms: float  # every Propose the draft server served for this request

    @property
    def decode_rounds(self) -> list[Round]:
        """Every round after the first, which prefilled the prompt."""
        return self.rounds[1:]

    def decode_tokens_per_s(self) -> float:
        """Tokens committed after the first round over the time from its end to the last round's end."""
        rounds = self.rounds
        seconds = (rounds[-1].end_ns - rounds[0].end_ns) / 1e9
        return sum(r.committed for r in rounds[1:]) / seconds if seconds > 0 else 0.0

    def drafted(self) -> int:
        return sum(r.k for r in self.rounds)


def _ms(span: dict) -> float:
    return (span["end_ns"] - span["start_ns"]) / 1e6


def read_requests(path: str | Path, trace_ids: set[str]) -> dict[str, Request]:
    """The requests of `trace_ids` found in the trace file, with their rounds in order."""
    spans_by_trace: dict[str, list[dict]] = defaultdict(list)
    for span in read_spans(path):
        if span["trace_id"] in trace_ids:
            spans_by_trace[span["trace_id"]].append(span)
    requests = {}
    for trace_id, spans in spans_by_trace.items():
        by_id = {s["span_id"]: s for s in spans}

        def round_of(span: dict) -> dict | None:
            parent = by_id.get(span["parent_span_id"])
            while parent is not None and parent["name"] != "specdec.round":
                parent = by_id.get(parent["parent_span_id"])
            return parent

        compute = {}
        for span in spans:
            if span["name"] == "specdec.verify" and (owner := round_of(span)) is not None:
                compute[owner["span_id"]] = _ms(span)
        rounds = []
        for span in spans:
            if span["name"] != "specdec.round":
                continue
            a = span["attributes"]
            rounds.append(
                Round(
                    index=a["specdec.round.index"],
                    k=a.get("specdec.round.k", 0),
                    accepted=a.get("specdec.round.accepted", 0),
                    committed=a.get("specdec.round.committed_tokens", 0),
                    start_ns=span["start_ns"],
                    end_ns=span["end_ns"],
                    draft_wait_ms=a.get("specdec.round.draft_latency_ms", 0.0),
                    verify_wait_ms=a.get("specdec.round.verify_latency_ms", 0.0),
                    verify_compute_ms=compute.get(span["span_id"]),
                )
            )
        if rounds:
            rounds.sort(key=lambda r: r.index)
            draft_ms = sum(_ms(s) for s in spans if s["name"] == _PROPOSE and s["kind"] == "SERVER")
            requests[trace_id] = Request(trace_id, rounds, draft_ms)
    return requests


def time_split(requests: list[Request]) -> dict[str, float]:
    """Median milliseconds per decode round: waiting for drafts, the target's forward pass, the
    rest of the verify wait (Ray hop, queueing, serialization), and the coordinator's own work
    (round time minus both waits: commit, detokenize, stream, choose k, start the next round)."""
    parts: dict[str, list[float]] = {
        "draft_wait": [],
        "verify_compute": [],
        "verify_transport": [],
        "coordination": [],
        "round": [],
    }
    for request in requests:
        rounds = request.rounds
        for this, following in zip(rounds[1:], rounds[2:]):  # the prefill round is not a decode round
            if this.verify_compute_ms is None:
                continue
            round_ms = (following.start_ns - this.start_ns) / 1e6
            parts["round"].append(round_ms)
            parts["draft_wait"].append(this.draft_wait_ms)
            parts["verify_compute"].append(this.verify_compute_ms)
            parts["verify_transport"].append(max(0.0, this.verify_wait_ms - this.verify_compute_ms))
            parts["coordination"].append(max(0.0, round_ms - this.draft_wait_ms - this.verify_wait_ms))
    return {name: statistics.median(values) if values else 0.0 for name, values in parts.items()}


def per_position(rounds: Iterable[Round], depth: Callable[[Round], int]) -> list[float]:
    """[i]: the share of the rounds counting draft position i + 1 (those with depth(round) > i)
    in which it was accepted."""
    counted: list[int] = []
    accepted: list[int] = []
    for r in rounds:
        for i in range(depth(r)):
            if i == len(counted):
                counted.append(0)
                accepted.append(0)
            counted[i] += 1
            accepted[i] += r.accepted > i
    return [a / n for a, n in zip(accepted, counted)]


def acceptance_by_position(requests: list[Request]) -> list[float]:
    """[i]: the share of rounds that drafted an (i+1)-th token in which it was accepted (vLLM's
    per-position acceptance: a rejection at i counts as a miss at every later position drafted)."""
    return per_position((r for request in requests for r in request.rounds), lambda r: r.k)
