"""The target tier's Prometheus metrics, served by each actor (a Ray actor is its own process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

from specdec.telemetry.metrics import BATCH_BUCKETS, LATENCY_BUCKETS

VERIFY_ROUNDS = Counter("specdec:target_verify_rounds", "Rounds verified (a forward pass serves several)")
VERIFY_MISSES = Counter(
    "specdec:target_verify_misses",
    "Rounds answered `miss`: the actor lacked the session's prefix (new replica, restart, eviction)",
)
VERIFY_BATCH_SIZE = Histogram(
    "specdec:target_verify_batch_size", "Rounds verified in one forward pass", buckets=BATCH_BUCKETS
)
FORWARD_LATENCY = Histogram(
    "specdec:target_forward_latency_seconds", "One batched verification forward pass", buckets=LATENCY_BUCKETS
)
# QUEUE_DEPTH is vLLM's vllm:num_requests_waiting per actor, ROUNDS_RUNNING its num_requests_running
# and KV_CACHE_USAGE its kv_cache_usage_perc (a fraction, as vLLM's is): the pool keeper sizes the
# pool on KV use and queued rounds (target_service/autoscale.py).
QUEUE_DEPTH = Gauge("specdec:target_queue_depth", "Rounds waiting for the model")
ROUNDS_RUNNING = Gauge("specdec:target_rounds_running", "Rounds in the forward pass now running")
KV_CACHE_USAGE = Gauge("specdec:target_kv_cache_usage_perc", "Share of the KV pool's blocks in use, 0..1")
SESSIONS = Gauge("specdec:target_sessions", "Sessions whose KV cache the actor holds")
CACHE_TOKENS = Gauge(
    "specdec:target_cache_tokens", "Cached token positions over all sessions (the bound is max_cached_tokens)"
)
KV_BLOCKS_USED = Gauge("specdec:target_kv_blocks_used", "KV pool blocks holding some session's positions")
KV_BLOCKS_TOTAL = Gauge("specdec:target_kv_blocks_total", "KV pool blocks (from --kv-cache-bytes)")
KV_PREEMPTIONS = Counter(
    "specdec:target_kv_preemptions",
    "Sessions dropped to free KV blocks for a pass (their next round is a miss the pool resends)",
)
OVERLOADED = Counter("specdec:target_overloaded", "Rounds refused because the queue was full (placed elsewhere)")
DECODER = Info("specdec:target_decoder", "The decoder that runs the target's passes: fused, or transformers' modules")
