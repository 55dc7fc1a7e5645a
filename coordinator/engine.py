"""The speculation engine: the round loop over a Proposer and a Verifier.

One round: the proposer drafts up to k tokens after the committed sequence, the verifier checks
them in one target pass and returns 1..k+1 tokens, and the engine commits them, applying EOS,
stop strings and max_new_tokens. The engine holds the only authoritative token list; both tiers'
caches are derived from it, which is why either side may lose a session and just prefill again.
k = 0 is plain decoding through the same path.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from opentelemetry import trace
from transformers import PreTrainedTokenizerBase

from coordinator import observe
from coordinator.drafting import DraftSide
from coordinator.text import OutputText
from specdec.acceptance import DraftProposal, Verification
from specdec.errors import InvalidArgument
from specdec.sampling import SamplingParams


class Proposer(Protocol):
    async def propose(self, session_id: str, tokens: Sequence[int], k: int, sampling: SamplingParams) -> DraftProposal:
        """At most k draft tokens to follow `tokens` (the whole committed sequence)."""

    async def end_session(self, session_id: str) -> None:
        """Free what the proposer holds for the session; unknown ids are fine."""


class Verifier(Protocol):
    async def verify(self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams) -> Verification:
        """Check `proposal` after `tokens` in one target pass; returns 1..k+1 tokens to commit."""

    async def end_session(self, session_id: str) -> None:
        """Free the session's cache; unknown ids are fine."""


class TargetInfo(Protocol):
    """What the engine must know of the target model without holding it (a `LoadedModel` fits)."""

    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: frozenset[int]
    vocab_size: int
    max_context: int


@dataclass(frozen=True)
class EngineConfig:
    default_draft_tokens: int = 4  # k for requests that leave speculation.max_draft_tokens at 0
    max_draft_tokens: int = 16  # the largest k a request may ask for
    pipeline: bool = True  # request round r+1's drafts while round r is verified
    draft_timeout_s: float = 2.0  # a proposal later than this is dropped: that round runs with k = 0
    draft_retry_s: float = 1.0  # after a draft failure, rounds run with k = 0 this long


@dataclass
class GenerationRequest:
    prompt: str = ""  # text, tokenized with the target's tokenizer ...
    prompt_token_ids: list[int] = field(default_factory=list)  # ... or token ids: exactly one of the two
    max_new_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    stop: Sequence[str] = ()
    speculate: bool = True  # False: k = 0, plain decoding
    max_draft_tokens: int = 0  # 0: the server's default k


class FinishReason(Enum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_new_tokens or the model's context
    CANCELLED = "cancelled"


@dataclass
class SpeculationStats:
    rounds: int = 0
    draft_tokens: int = 0  # proposed
    accepted_tokens: int = 0  # proposed and accepted
    non_speculative_rounds: int = 0  # rounds verified with no draft (k = 0)
    pipelined_rounds: int = 0  # rounds whose drafts were requested during the previous verification
    draft_failures: int = 0  # proposals lost to a draft tier that erred or was too slow
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: rounds whose draft i was accepted
    # Where the request's time went, as the engine saw it: waiting for proposals (what pipelining
    # did not hide), waiting for verification (transport, queueing, the target pass), and in all
    # from the first round to the last token; the rest is coordination (commit, detokenize, stream).
    draft_wait_s: float = 0.0
    verify_wait_s: float = 0.0
    seconds: float = 0.0

    def record(self, proposed: int, accepted: int) -> None:
        self.rounds += 1
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        self.non_speculative_rounds += proposed == 0
        self.accepted_per_position.extend([0] * (proposed - len(self.accepted_per_position)))
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class Delta:
    """What one round adds to the output; the last delta of a request carries the final fields."""

    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    stats: SpeculationStats | None = None


class SpeculativeEngine:
    def __init__(self, proposer: Proposer, verifier: Verifier, target: TargetInfo, config: EngineConfig = EngineConfig(), tracer: trace.Tracer | None = None):
        self.tracer = tracer or trace.get_tracer("specdec.coordinator")  # round spans
        self.proposer = proposer
        self.verifier = verifier
        self.target = target
        self.config = config

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        prompt, request = self.prepare(request)
        k_max = self._k_max(request)
        session_id = uuid.uuid4().hex
        tokens = list(prompt)
        output = OutputText(self.target.tokenizer, self.target.eos_token_ids, request.stop)
        stats = SpeculationStats()
        cfg = self.config
        drafts = DraftSide(self.proposer, session_id, request.sampling, pipeline=cfg.pipeline, timeout_s=cfg.draft_timeout_s, retry_s=cfg.draft_retry_s)

        def k_for(length: int) -> int:
            # Never draft past what may still be emitted: the verifier adds one token itself.
            return min(k_max, request.max_new_tokens - (length - len(prompt)) - 1, self.target.max_context - length - 1)

        started = time.perf_counter()
        first_token_s = None
        try:
            while True:
                generated = len(tokens) - len(prompt)
                k = k_for(len(tokens))
                hits = drafts.pipelined_hits
                with observe.round_span(self.tracer, stats.rounds, k) as span:
                    t0 = time.perf_counter()
                    proposal, guess, fallback = await drafts.propose(tokens, k)
                    t1 = time.perf_counter()
                    verifying = asyncio.ensure_future(self.verifier.verify(session_id, tokens, proposal, request.sampling))
                    drafts.prefetch(tokens, proposal, guess, k_for(len(tokens) + len(proposal.token_ids) + 1))
                    result = await verifying
                    t2 = time.perf_counter()
                    room = min(request.max_new_tokens - generated, self.target.max_context - len(tokens))
                    kept, text = output.add(result.accepted_ids[:room])
                    observe.end_round(
                        span, proposed=len(proposal.token_ids), accepted=result.num_accepted, committed=len(kept),
                        fallback=fallback, pipelined=drafts.pipelined_hits > hits, draft_s=t1 - t0, verify_s=t2 - t1,
                    )  # fmt: skip
                stats.draft_wait_s += t1 - t0
                stats.verify_wait_s += t2 - t1
                stats.record(len(proposal.token_ids), result.num_accepted)
                stats.pipelined_rounds, stats.draft_failures = drafts.pipelined_hits, drafts.failures
                tokens.extend(kept)
                if first_token_s is None and kept:
                    first_token_s = time.perf_counter() - started
                reason = self._finish_reason(output, len(tokens) - len(prompt), len(tokens), request)
                if reason is None:
                    yield Delta(kept, text)
                    continue
                if not output.stopped:
                    text += output.finish()
                stats.seconds = time.perf_counter() - started
                observe.end_request(first_token_s, stats.seconds, len(tokens) - len(prompt))
                yield Delta(kept, text, reason, len(prompt), stats)
                return
        finally:
            await drafts.cancel_pipelined()
            await self.proposer.end_session(session_id)
            await self.verifier.end_session(session_id)

    async def generate(self, request: GenerationRequest) -> Delta:
        """The whole output as one Delta (tokens, text, finish reason, usage, statistics)."""
        token_ids: list[int] = []
        text = []
        async for delta in self.stream(request):
            token_ids.extend(delta.token_ids)
            text.append(delta.text)
        return replace(delta, token_ids=token_ids, text="".join(text))

    def prepare(self, request: GenerationRequest) -> tuple[list[int], GenerationRequest]:
        """Validate every field (InvalidArgument names the first bad one), tokenize, draw a seed."""
        if request.prompt and request.prompt_token_ids:
            raise InvalidArgument("prompt", "give prompt or prompt_token_ids, not both")
        if request.prompt:
            prompt = self.target.tokenizer(request.prompt)["input_ids"]
        else:
            prompt = list(request.prompt_token_ids)
            bad = [t for t in prompt if not 0 <= t < self.target.vocab_size]
            if bad:
                raise InvalidArgument("prompt_token_ids", f"token id {bad[0]} is outside [0, {self.target.vocab_size})")
        if not prompt:
            raise InvalidArgument("prompt", "is empty")
        if len(prompt) >= self.target.max_context:
            raise InvalidArgument("prompt", f"has {len(prompt)} tokens; the model's context is {self.target.max_context}")
        room = self.target.max_context - len(prompt)
        if not isinstance(request.max_new_tokens, int) or not 1 <= request.max_new_tokens <= room:
            raise InvalidArgument("max_new_tokens", f"must be in [1, {room}] for this prompt, got {request.max_new_tokens!r}")
        request.sampling.validate()
        if any(not isinstance(s, str) for s in request.stop):
            raise InvalidArgument("stop", "must be strings")
        if not isinstance(request.max_draft_tokens, int) or not 0 <= request.max_draft_tokens <= self.config.max_draft_tokens:
            raise InvalidArgument(
                "speculation.max_draft_tokens",
                f"must be in [0, {self.config.max_draft_tokens}], got {request.max_draft_tokens!r}",
            )
        if not request.sampling.greedy and request.sampling.seed is None:
            request = replace(request, sampling=replace(request.sampling, seed=secrets.randbits(63)))
        return prompt, request

    def _k_max(self, request: GenerationRequest) -> int:
        if not request.speculate:
            return 0
        return request.max_draft_tokens or self.config.default_draft_tokens

    def _finish_reason(self, output: OutputText, generated: int, length: int, request: GenerationRequest) -> FinishReason | None:
        if output.stopped:
            return FinishReason.STOP
        if generated >= request.max_new_tokens or length >= self.target.max_context:
            return FinishReason.LENGTH
        return None

