"""What the engine reports about each round and request: a `specdec.round` span per round (in
the request's trace, so the draft call and the target's verify span nest under it) and the
coordinator's Prometheus metrics. Attributes carry counts and timings only, never tokens or text.
"""

from __future__ import annotations

from opentelemetry import trace

from specdec.coordinator import metrics


def round_span(tracer: trace.Tracer, index: int, k_max: int, why: str):
    """The span of round `index`, current while its drafts are fetched and verified; `why` says
    how k was chosen (fixed, adaptive, probe, or load: speculation off under load)."""
    metrics.K_CHOICES.labels(why).inc()
    return tracer.start_as_current_span(
        "specdec.round",
        attributes={"specdec.round.index": index, "specdec.round.k_max": k_max, "specdec.round.k_policy": why},
    )


def end_round(
    span: trace.Span,
    *,
    proposed: int,
    accepted: int,
    committed: int,
    fallback: bool,
    pipelined: bool,
    draft_s: float,
    verify_s: float,
    source: str = "",
    tree: bool = False,
) -> None:
    """`tree`: the drafts were a branching token tree; `proposed` counts its nodes and `accepted`
    the accepted path."""
    bonus = proposed > 0 and accepted == proposed  # every draft accepted: the target's token is a free extra
    span.set_attributes(
        {
            "specdec.round.k": proposed,
            "specdec.round.draft_source": source,  # which drafter answered (DraftSource); "" without drafts
            "specdec.round.accepted": accepted,
            "specdec.round.tree": tree,
            "specdec.round.bonus": bonus,
            "specdec.round.fallback": fallback,
            "specdec.round.pipelined": pipelined,
            "specdec.round.committed_tokens": committed,
            "specdec.round.draft_latency_ms": round(1000 * draft_s, 3),
            "specdec.round.verify_latency_ms": round(1000 * verify_s, 3),
        }
    )
    metrics.ROUNDS.inc()
    metrics.FALLBACK_ROUNDS.inc(fallback)
    metrics.TREE_ROUNDS.inc(tree)
    metrics.DRAFT_LATENCY.observe(draft_s)
    metrics.VERIFY_LATENCY.observe(verify_s)
    metrics.ROUND_LATENCY.observe(draft_s + verify_s)
    if proposed:
        metrics.NUM_DRAFTS.inc()
        metrics.NUM_DRAFT_TOKENS.inc(proposed)
        metrics.NUM_ACCEPTED_TOKENS.inc(accepted)
        for position in range(accepted):
            metrics.NUM_ACCEPTED_TOKENS_PER_POS.labels(str(position)).inc()


def end_request(first_token_s: float | None, seconds: float, tokens: int) -> None:
    """Time to first token, and the mean time per token after it."""
    if first_token_s is None:
        return
    metrics.TIME_TO_FIRST_TOKEN.observe(first_token_s)
    if tokens > 1:
        metrics.TIME_PER_OUTPUT_TOKEN.observe((seconds - first_token_s) / (tokens - 1))
    metrics.GENERATION_TOKENS.inc(tokens)
