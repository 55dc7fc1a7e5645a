"""The speculation engine: the round loop over a Proposer and a Verifier.

One round: the proposer drafts up to k tokens after the committed sequence, the verifier checks
them in one target pass and returns 1..k+1 tokens, and the engine commits them, applying EOS,
stop strings and max_new_tokens. The engine holds the only authoritative token list; both tiers'
caches are derived from it, which is why either side may lose a session and just prefill again.
k = 0 is plain decoding through the same path.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from opentelemetry import trace
from transformers import PreTrainedTokenizerBase

from specdec.coordinator import observe
from specdec.coordinator.adaptive import CostModel, DraftLengthPolicy, RoundPlan
from specdec.coordinator.chat import ChatMessage, ChatTemplate
from specdec.coordinator.drafting import Drafts, DraftSide
from specdec.coordinator.text import OutputText
from specdec.core.acceptance import DraftProposal, Verification
from specdec.core.errors import InvalidArgument
from specdec.core.sampling import SamplingParams
from specdec.core.tree import is_chain

# A prompt longer than this (characters) is tokenized off the event loop that serves every other
# request: 1 MiB takes about a second on 2 cores, and the Rust tokenizer releases the GIL (measured).
_TOKENIZE_IN_THREAD_CHARS = 1 << 16
MAX_AFFINITY_KEY_BYTES = 256  # a cache-affinity key names a kind of request, it carries no content


log = logging.getLogger(__name__)


class Proposer(Protocol):
    async def propose(
        self, session_id: str, tokens: Sequence[int], k: int, sampling: SamplingParams, model_k: int | None = None
    ) -> DraftProposal:
        """At most k draft tokens to follow `tokens` (the whole committed sequence), drawn under
        `sampling`; a draft model among the proposer's drafters proposes at most `model_k` of
        them (None: k; 0: lookups only). The proposal names its source (`DraftSource`). A
        proposer that drafts token trees also takes `tree=True` (the engine passes it only with
        `token_tree` on) and may then answer a tree of up to k nodes."""

    async def end_session(self, session_id: str, completion: Sequence[int] = ()) -> None:
        """Free what the proposer holds for the session; unknown ids are fine. `completion` is the
        request's output (prompt excluded), which a suffix drafter learns from."""


class Verifier(Protocol):
    async def verify(
        self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams
    ) -> Verification:
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
    default_draft_tokens: int = 8  # k for requests that leave speculation.max_draft_tokens at 0
    max_draft_tokens: int = 16  # the largest k a request may ask for
    pipeline: bool = True  # request round r+1's drafts while round r is verified
    # Ask the draft tier for token trees of up to k nodes (suffix drafting answers them; other
    # drafters answer chains). Tree rounds are not pipelined: "every draft accepted" has no one
    # meaning in a tree.
    token_tree: bool = False
    draft_timeout_s: float = 2.0  # a proposal later than this is dropped: that round runs with k = 0
    draft_retry_s: float = 1.0  # after a draft failure, rounds run with k = 0 this long
    adaptive: bool = True  # each round's k from the request's acceptance and the measured costs (adaptive.py)
    # Adaptive k at 0 still drafts one token every this many rounds, to notice a change; below its
    # limit, one more than the best as often.
    probe_every: int = 8
    # Load awareness: with more than this many requests generating, rounds run without drafts
    # (the target tier is saturated: a rejected draft costs another request's verify time). 0: never.
    speculation_max_running: int = 0
    # Load awareness, gradual: the target positions one batched pass should verify for all
    # generating requests together; each request drafts at most budget // running - 1 tokens, so
    # drafts shrink as load grows and stop when every request's share is one position (on a CPU,
    # a pass costs about linearly in its positions beyond a few; a GPU affords a far larger budget).
    # 0: no budget; -1 (auto): `connect_engine` picks it from the target tier's device.
    speculation_token_budget: int = 0
    # Every round searches the new text for each stop string and holds back any tail that could
    # begin one (coordinator/text.py): the cost grows with their number times their length.
    max_stop_strings: int = 16
    max_stop_chars: int = 256  # the longest stop string
    # Jinja chat template for requests that send `messages` (--chat-template FILE); None: the
    # target tokenizer's own (coordinator/chat.py).
    chat_template: str | None = field(default=None, repr=False)


@dataclass
class GenerationRequest:
    prompt: str = ""  # text, tokenized with the target's tokenizer ...
    prompt_token_ids: list[int] = field(default_factory=list)  # ... or token ids ...
    messages: Sequence[ChatMessage] = ()  # ... or a conversation, through the chat template: exactly one
    max_new_tokens: int | None = 64  # None: up to the model's context
    sampling: SamplingParams = SamplingParams()
    stop: Sequence[str] = ()
    speculate: bool = True  # False: k = 0, plain decoding
    max_draft_tokens: int = 0  # 0: the server's default k
    cache_affinity_key: str = ""  # requests with one key draft on one draft replica; "": by session
    ignore_eos: bool = False  # generate past EOS, to max_new_tokens or a stop string (benchmarks)


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
    def __init__(
        self,
        proposer: Proposer,
        verifier: Verifier,
        target: TargetInfo,
        config: EngineConfig = EngineConfig(),
        tracer: trace.Tracer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.tracer = tracer or trace.get_tracer("specdec.coordinator")  # round spans
        self.clock = clock  # seconds: round timings (the cost model's input) and the retry delay
        self.proposer = proposer
        self.verifier = verifier
        self.target = target
        self.config = config
        self.chat = ChatTemplate(target.tokenizer, config.chat_template)
        self._longest_token: int | None = None  # characters of the longest vocabulary entry, once needed
        self.costs = CostModel()  # draft and verify costs, learned from every round of every request
        self.draft_sources: set[str] = set()  # source classes the draft tier has answered with (adaptive.plan)
        self.running = 0  # requests generating now (load awareness)
        self._ending: set[asyncio.Task] = set()  # draft sessions still ending after their request

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Generate `request`, one Delta per round; the last one carries the finish reason, the
        usage and the round statistics. Cancelling the iteration ends both tiers' sessions."""
        if _prompt_chars(request) > _TOKENIZE_IN_THREAD_CHARS:
            prompt, request = await asyncio.to_thread(self.prepare, request)
        else:
            prompt, request = self.prepare(request)
        g = _Generation(self, request, prompt)
        started, first_token_s = self.clock(), None
        self.running += 1
        try:
            while True:
                cap = g.draft_room(len(g.tokens))
                kept, text = await self._round(g, cap, g.policy.plan(cap, self.running))
                g.tokens.extend(kept)
                if first_token_s is None and kept:
                    first_token_s = self.clock() - started
                reason = self._finish_reason(g.output, g.generated, len(g.tokens), request)
                if reason is None:
                    yield Delta(kept, text)
                    continue
                if not g.output.stopped:
                    text += g.output.finish()
                g.stats.seconds = self.clock() - started
                observe.end_request(first_token_s, g.stats.seconds, g.generated)
                yield Delta(kept, text, reason, len(prompt), g.stats)
                return
        finally:
            self.running -= 1
            await g.drafts.cancel_pipelined()
            await asyncio.gather(
                self._end_draft_session(g.session_id, g.tokens[len(prompt) :]),
                self.verifier.end_session(g.session_id),
            )

    async def _round(self, g: _Generation, cap: int, planned: RoundPlan) -> tuple[list[int], str]:
        """One round, at most `cap` drafts: drafts, one verify pass (the next round's drafts asked
        for meanwhile), commit. Returns the tokens kept (EOS, stop strings and the length limits
        applied) and their text."""
        with observe.round_span(self.tracer, g.stats.rounds, cap, planned.why) as span:
            hits = g.drafts.pipelined_hits
            t0 = self.clock()
            proposal, guess, fallback = self._in_vocabulary(
                await g.drafts.propose(g.tokens, planned.k, planned.model_k)
            )
            t1 = self.clock()
            verifying = asyncio.ensure_future(
                self.verifier.verify(g.session_id, g.tokens, proposal, g.request.sampling)
            )
            # The next round's k is not known before this one is verified: ask for this round's,
            # or one if it drafted none (a prefix of a longer draft serves too).
            next_room = g.draft_room(len(g.tokens) + len(proposal.token_ids) + 1)
            next_model_k = g.policy.pipelined_model_k(planned.model_k)
            g.drafts.prefetch(g.tokens, proposal, guess, min(max(planned.k, 1), next_room), next_model_k)
            result = await verifying
            t2 = self.clock()
            kept, text = g.output.add(result.accepted_ids[: g.room()])
            observe.end_round(
                span, proposed=len(proposal.token_ids), accepted=result.num_accepted, committed=len(kept),
                fallback=fallback, pipelined=g.drafts.pipelined_hits > hits, draft_s=t1 - t0, verify_s=t2 - t1,
                source=proposal.source if proposal.token_ids else "",
                tree=proposal.parents is not None and not is_chain(proposal.parents),
            )  # fmt: skip
        g.policy.observe(planned, proposal, fallback, result.num_accepted, draft_s=t1 - t0, verify_s=t2 - t1)
        g.stats.record(len(proposal.token_ids), result.num_accepted)
        g.stats.draft_wait_s += t1 - t0
        g.stats.verify_wait_s += t2 - t1
        g.stats.pipelined_rounds, g.stats.draft_failures = g.drafts.pipelined_hits, g.drafts.failures
        return kept, text

    def _in_vocabulary(self, drafts: Drafts) -> Drafts:
        """A draft tier serving another vocabulary (a misconfigured pair) must not fail the
        target's batch, which other requests share: its drafts are dropped for the round."""
        if all(0 <= t < self.target.vocab_size for t in drafts.proposal.token_ids):
            return drafts
        log.warning("draft ids outside the target's vocabulary of %d: round without drafts", self.target.vocab_size)
        return Drafts(DraftProposal([]), None, fallback=True)

    async def generate(self, request: GenerationRequest) -> Delta:
        """The whole output as one Delta (tokens, text, finish reason, usage, statistics)."""
        token_ids: list[int] = []
        text = []
        async for delta in self.stream(request):
            token_ids.extend(delta.token_ids)
            text.append(delta.text)
        return replace(delta, token_ids=token_ids, text="".join(text))

    async def _end_draft_session(self, session_id: str, completion: Sequence[int]) -> None:
        """End the draft tier's session, waiting no longer than for a proposal: a draft tier that
        stopped answering must not hold a finished request's status for the client's whole
        EndSession deadline. The call goes on in the background; a session it never reaches
        expires by the replica's TTL."""
        ending = asyncio.ensure_future(self.proposer.end_session(session_id, completion))
        self._ending.add(ending)  # a reference, or the loop may collect the task mid-call
        ending.add_done_callback(_settled(self._ending))
        try:
            await asyncio.wait_for(asyncio.shield(ending), self.config.draft_timeout_s)
        except TimeoutError:
            pass

    def prepare(self, request: GenerationRequest) -> tuple[list[int], GenerationRequest]:
        """Validate every field (InvalidArgument names the first bad one), tokenize, draw a seed."""
        given = [name for name in ("prompt", "prompt_token_ids", "messages") if getattr(request, name)]
        if len(given) > 1:
            raise InvalidArgument(given[0], f"give prompt or prompt_token_ids or messages, not {' and '.join(given)}")
        max_context = self.target.max_context
        if request.prompt or request.messages:
            field_name = "messages" if request.messages else "prompt"
            text = self.chat.render(request.messages) if request.messages else request.prompt
            # Refused before tokenizing, which takes seconds per MiB: no token covers more
            # characters than its own entry in the vocabulary, so a longer text cannot fit.
            if len(text) > max_context and len(text) > max_context * self._longest():
                raise InvalidArgument(
                    field_name,
                    f"has {len(text)} characters, more than the model's context of {max_context} tokens can hold",
                )
            prompt = self.chat.encode(text) if request.messages else self.target.tokenizer(text)["input_ids"]
        else:
            prompt = list(request.prompt_token_ids)
            if max_context <= len(prompt):
                raise InvalidArgument(
                    "prompt", f"has {len(prompt)} tokens; the model's context is {max_context}"
                )  # before scanning millions of ids
            bad = [t for t in prompt if not 0 <= t < self.target.vocab_size]
            if bad:
                raise InvalidArgument("prompt_token_ids", f"token id {bad[0]} is outside [0, {self.target.vocab_size})")
        if not prompt:
            raise InvalidArgument("prompt", "is empty")
        if len(prompt) >= max_context:
            raise InvalidArgument("prompt", f"has {len(prompt)} tokens; the model's context is {max_context}")
        room = self.target.max_context - len(prompt)
        if request.max_new_tokens is None:
            request = replace(request, max_new_tokens=room)
        if not isinstance(request.max_new_tokens, int) or not 1 <= request.max_new_tokens <= room:
            raise InvalidArgument(
                "max_new_tokens", f"must be in [1, {room}] for this prompt, got {request.max_new_tokens!r}"
            )
        request.sampling.validate()
        if any(not isinstance(s, str) for s in request.stop):
            raise InvalidArgument("stop", "must be strings")
        if len(request.stop) > self.config.max_stop_strings:
            raise InvalidArgument("stop", f"at most {self.config.max_stop_strings} strings, got {len(request.stop)}")
        if (longest := max(map(len, request.stop), default=0)) > self.config.max_stop_chars:
            raise InvalidArgument("stop", f"each at most {self.config.max_stop_chars} characters, got {longest}")
        if (
            not isinstance(request.max_draft_tokens, int)
            or not 0 <= request.max_draft_tokens <= self.config.max_draft_tokens
        ):
            raise InvalidArgument(
                "speculation.max_draft_tokens",
                f"must be in [0, {self.config.max_draft_tokens}], got {request.max_draft_tokens!r}",
            )
        key = request.cache_affinity_key
        if not isinstance(key, str) or len(key.encode()) > MAX_AFFINITY_KEY_BYTES:
            raise InvalidArgument(
                "speculation.cache_affinity_key", f"must be a string of at most {MAX_AFFINITY_KEY_BYTES} bytes"
            )
        if not request.sampling.greedy and request.sampling.seed is None:
            request = replace(request, sampling=replace(request.sampling, seed=secrets.randbits(63)))
        return prompt, request

    def _longest(self) -> int:
        if self._longest_token is None:
            self._longest_token = max(map(len, self.target.tokenizer.get_vocab()), default=1)
        return self._longest_token

    def _finish_reason(
        self, output: OutputText, generated: int, length: int, request: GenerationRequest
    ) -> FinishReason | None:
        if output.stopped:
            return FinishReason.STOP
        if generated >= request.max_new_tokens or length >= self.target.max_context:
            return FinishReason.LENGTH
        return None


class _Generation:
    """One request's state across its rounds. `tokens` (prompt + committed output) is the only
    authoritative copy: both tiers' caches are derived from it."""

    def __init__(self, engine: SpeculativeEngine, request: GenerationRequest, prompt: list[int]):
        cfg = engine.config
        self.request = request
        self.prompt_len = len(prompt)
        self.tokens = list(prompt)
        self.max_context = engine.target.max_context
        self.k_max = (request.max_draft_tokens or cfg.default_draft_tokens) if request.speculate else 0
        self.session_id = uuid.uuid4().hex
        eos = () if request.ignore_eos else engine.target.eos_token_ids
        self.output = OutputText(engine.target.tokenizer, eos, request.stop)
        self.stats = SpeculationStats()
        self.policy = DraftLengthPolicy(cfg, engine.costs, engine.draft_sources, greedy=request.sampling.greedy)
        self.drafts = DraftSide(
            engine.proposer, self.session_id, request.sampling, pipeline=cfg.pipeline,
            timeout_s=cfg.draft_timeout_s, retry_s=cfg.draft_retry_s, clock=engine.clock,
            affinity=request.cache_affinity_key, tree=cfg.token_tree,
        )  # fmt: skip

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def room(self) -> int:
        """Tokens that may still be committed."""
        return min(self.request.max_new_tokens - self.generated, self.max_context - len(self.tokens))

    def draft_room(self, length: int) -> int:
        """The most drafts after `length` tokens: never past what may still be emitted (the
        verifier adds one token of its own)."""
        generated = length - self.prompt_len
        return min(self.k_max, self.request.max_new_tokens - generated - 1, self.max_context - length - 1)


def _prompt_chars(request: GenerationRequest) -> int:
    return len(request.prompt) + sum(len(m.content) for m in request.messages if isinstance(m.content, str))


def _settled(pending: set[asyncio.Task]):
    """Done callback: forget the task, and take its outcome (an error after we stopped waiting
    would otherwise be logged as 'never retrieved'; the session then expires by TTL)."""

    def done(task: asyncio.Task) -> None:
        pending.discard(task)
        if not task.cancelled():
            task.exception()

    return done
