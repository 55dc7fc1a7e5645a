"""Between the wire (specdec.v1 messages) and the engine's dataclasses, in one place."""

from __future__ import annotations

from specdec.coordinator.chat import ChatMessage
from specdec.coordinator.engine import Delta, FinishReason, GenerationRequest
from specdec.core.sampling import SamplingParams
from specdec.v1 import generation_pb2 as pb

_FINISH = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}


def request_from_proto(msg: pb.GenerateRequest | pb.GenerateStreamRequest) -> GenerationRequest:
    s = msg.sampling
    return GenerationRequest(
        prompt=msg.prompt,
        prompt_token_ids=list(msg.prompt_token_ids),
        messages=[ChatMessage(m.role, m.content) for m in msg.messages],
        max_new_tokens=msg.max_new_tokens,
        sampling=SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p or 1.0,  # 0 or unset means 1 on the wire
            top_k=s.top_k,
            seed=s.seed if s.HasField("seed") else None,
        ),
        stop=list(msg.stop),
        speculate=not msg.speculation.disabled,
        max_draft_tokens=msg.speculation.max_draft_tokens,
        cache_affinity_key=msg.speculation.cache_affinity_key,
    )


def response_to_proto(result: Delta, trace_id: str = "") -> pb.GenerateResponse:
    """The final Delta of a request (as `SpeculativeEngine.generate` returns it) as a response."""
    stats = result.stats
    return pb.GenerateResponse(
        text=result.text,
        token_ids=result.token_ids,
        finish_reason=_FINISH[result.finish_reason],
        usage=pb.Usage(prompt_tokens=result.prompt_tokens, completion_tokens=len(result.token_ids)),
        speculation=pb.SpeculationStats(
            rounds=stats.rounds,
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            non_speculative_rounds=stats.non_speculative_rounds,
            accepted_per_position=stats.accepted_per_position,
            pipelined_rounds=stats.pipelined_rounds,
            draft_failures=stats.draft_failures,
            draft_wait_seconds=stats.draft_wait_s,
            verify_wait_seconds=stats.verify_wait_s,
            generation_seconds=stats.seconds,
        ),
        trace_id=trace_id,
    )
