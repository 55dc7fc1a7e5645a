"""The coordinator's Prometheus metrics: speculation counters per round, requests, latencies."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from specdec.telemetry.metrics import LATENCY_BUCKETS

# Speculation, in vLLM's names (`vllm:spec_decode_*`), so existing dashboards chart them.
NUM_DRAFTS = Counter("specdec:spec_decode_num_drafts", "Rounds that verified at least one draft token")
NUM_DRAFT_TOKENS = Counter("specdec:spec_decode_num_draft_tokens", "Draft tokens proposed and verified")
NUM_ACCEPTED_TOKENS = Counter("specdec:spec_decode_num_accepted_tokens", "Draft tokens accepted by the target")
NUM_ACCEPTED_TOKENS_PER_POS = Counter(
    "specdec:spec_decode_num_accepted_tokens_per_pos",
    "Rounds whose draft token at `position` (0-based) was accepted",
    ["position"],
)
ROUNDS = Counter("specdec:rounds", "Verification rounds (target passes asked for)")
FALLBACK_ROUNDS = Counter(
    "specdec:fallback_rounds", "Rounds run with k = 0 because the draft tier failed, was too slow, or is being retried"
)
TREE_ROUNDS = Counter(
    "specdec:tree_rounds", "Rounds whose drafts were a branching token tree (k counts its nodes, accepted its path)"
)
K_CHOICES = Counter(
    "specdec:draft_length_choices",
    "Rounds by how their k was chosen: fixed, adaptive, probe, or load (drafts shrunk or off: the target tier is busy)",
    ["policy"],
)
REQUESTS = Counter(
    "specdec:requests",
    "Finished calls: gRPC Generate and GenerateStream, HTTP completions and chat completions (code: the gRPC code)",
    ["finish_reason", "code"],
)
PROMPT_TOKENS = Counter("specdec:prompt_tokens", "Prompt tokens of admitted requests")
GENERATION_TOKENS = Counter("specdec:generation_tokens", "Tokens generated")

TIME_TO_FIRST_TOKEN = Histogram(
    "specdec:time_to_first_token_seconds",
    "From the request's admission to its first generated token",
    buckets=LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "specdec:time_per_output_token_seconds",
    "After the first token: seconds per further token, per request",
    buckets=LATENCY_BUCKETS,
)
ROUND_LATENCY = Histogram(
    "specdec:round_latency_seconds", "One round: drafts ready to tokens committed", buckets=LATENCY_BUCKETS
)
DRAFT_LATENCY = Histogram(
    "specdec:draft_latency_seconds",
    "Per round, the wait for drafts (what pipelining did not hide)",
    buckets=LATENCY_BUCKETS,
)
VERIFY_LATENCY = Histogram(
    "specdec:verify_latency_seconds", "Per round, the wait for the target tier's verification", buckets=LATENCY_BUCKETS
)

REQUESTS_RUNNING = Gauge(
    "specdec:requests_running",
    "Requests generating now (the coordinator's queue depth; beyond max_inflight: RESOURCE_EXHAUSTED)",
)
# Load signals, as vLLM names them: `specdec:requests_waiting` is vllm:num_requests_waiting (admitted,
# not started: here, no token yet), and requests_running - requests_waiting is vllm:num_requests_running.
REQUESTS_WAITING = Gauge(
    "specdec:requests_waiting", "Requests admitted that have no token yet (their prefill waits or runs)"
)
MAX_INFLIGHT = Gauge(
    "specdec:requests_max_inflight", "The admission bound max_inflight: requests_running / this is the fill"
)
