"""The draft tier's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from specdec.telemetry.metrics import BATCH_BUCKETS, LATENCY_BUCKETS

PROPOSE_CALLS = Counter("specdec:draft_propose_calls", "Propose calls answered, by gRPC status code", ["code"])
PROPOSE_LATENCY = Histogram(
    "specdec:draft_propose_latency_seconds",
    "Propose calls, arrival to answer (successful calls)",
    buckets=LATENCY_BUCKETS,
)
DRAFT_TOKENS = Counter("specdec:draft_tokens", "Draft tokens proposed")
# A hybrid drafter's per-round choice: ngram (a long match), ngram_short (a shorter match),
# suffix (suffix decoding's match) or model (no match at all); a replica without a model counts
# every round as its lookup's.
DRAFT_ROUNDS = Counter("specdec:draft_rounds", "Propose calls answered, by the drafter that answered", ["source"])
BATCH_SIZE = Histogram(
    "specdec:draft_batch_size", "Calls served by one batched draft-model step", buckets=BATCH_BUCKETS
)
QUEUE_DEPTH = Gauge("specdec:draft_queue_depth", "Calls waiting for the draft model")
# The replica's load, as Ray Serve scales on it (ongoing requests per replica): every drafter's
# calls, where QUEUE_DEPTH counts only the draft model's (lookup drafters never queue).
REQUESTS_RUNNING = Gauge("specdec:draft_requests_running", "Propose calls being answered now")
SESSIONS = Gauge("specdec:draft_sessions", "Sessions held by this replica")
CACHE_TOKENS = Gauge(
    "specdec:draft_cache_tokens", "Token positions held over all sessions (the bound is max_cached_tokens)"
)
SUFFIX_LOOKUPS = Counter(
    "specdec:draft_suffix_lookups",
    "Suffix-decoding lookups, by where the draft came from (context, cache) or none",
    ["result"],
)
SUFFIX_CACHE_TOKENS = Gauge("specdec:draft_suffix_cache_tokens", "Completion tokens in the suffix cache")
SUFFIX_CACHE_BYTES = Gauge("specdec:draft_suffix_cache_bytes", "The suffix cache's memory (ring and index, estimated)")
