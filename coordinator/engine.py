"""The speculation engine: the round loop over a Proposer and a Verifier.

One round: the proposer drafts up to k tokens after the committed sequence, the verifier checks
them in one target pass and returns 1..k+1 tokens, and the engine commits them, applying EOS,
stop strings and max_new_tokens. The engine holds the only authoritative token list; both tiers'
caches are derived from it, which is why either side may lose a session and just prefill again.
k = 0 is plain decoding through the same path.

What flows through a round, by type: `GenerationRequest` in, checked and tokenized by
`RequestValidator` (validation.py) into `Prepared`; each round its `DraftLengths` (adaptive.py), the
`Drafts` of the draft side (drafting.py, where the `Proposer` interface lives), one
`Verification` (specdec/core/acceptance.py) and the `Committed` tokens and text; out, one `Delta`
per round.
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
from typing import NamedTuple, Protocol

from opentelemetry import trace
from transformers import PreTrainedTokenizerBase

from specdec.coordinator import observe
from specdec.coordinator.adaptive import PREFILL, CostModel, DraftLengthPolicy, DraftLengths
from specdec.coordinator.chat import ChatMessage, ChatTemplate
from specdec.coordinator.drafting import Drafts, DraftSide, Proposer
from specdec.coordinator.text import OutputText
from specdec.coordinator.validation import RequestValidator
from specdec.core.acceptance import DraftProposal, Verification
from specdec.core.sampling import SamplingParams
from specdec.core.settings import setting
from specdec.core.tree import is_chain

# A prompt longer than this (characters) is tokenized off the event loop that serves every other
# request: tokenizing takes time in proportion to the text, and the Rust tokenizer releases the
# GIL, so a worker thread runs it beside the loop.
_TOKENIZE_IN_THREAD_CHARS = 1 << 16


log = logging.getLogger(__name__)


class Verifier(Protocol):
    """The target tier as the engine sees it: `TargetPool` (Ray) and `LocalVerifier` implement it.
    (The `Proposer`, the draft tier's interface, lives in drafting.py, beside its one caller.)"""

    async def verify(
        self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams
    ) -> Verification:
        """Check `proposal` (a chain, or a tree with `parents`) after `tokens` (the whole committed
        sequence) in one target pass, under `sampling`; returns 1..k+1 tokens to commit."""

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
    # k for requests that leave speculation.max_draft_tokens at 0
    default_draft_tokens: int = setting(8, "k for requests that leave it unset", type="nonnegative_int")
    max_draft_tokens: int = setting(16, "largest k a request may ask for", type="positive_int")
    pipeline: bool = setting(True, "'on': request round r+1's drafts while round r is verified")
    # Ask the draft tier for token trees of up to k nodes (suffix drafting answers them; other
    # drafters answer chains). Tree rounds are not pipelined: "every draft accepted" has no one
    # meaning in a tree.
    token_tree: bool = setting(
        False, "'on': ask the draft tier for token trees of up to k nodes, verified in one pass (suffix drafting)"
    )
    draft_timeout_s: float = setting(
        2.0, "a proposal later than this is dropped (that round runs with k = 0)", type="positive_seconds"
    )
    draft_retry_s: float = 1.0  # after a draft failure, rounds run with k = 0 this long
    adaptive: bool = setting(  # adaptive.py
        True, "'on': each round's k from the request's acceptance and the measured costs, at most the request's max"
    )
    # Adaptive k at 0 still drafts one token every this many rounds, to notice a change; below its
    # limit, one more than the best as often.
    probe_every: int = 8
    # Load awareness: a rejected draft costs another request's verify time.
    speculation_max_running: int = setting(
        0,
        "with more requests generating than this, rounds run without drafts (target saturated); 0: never",
        type="nonnegative_int",
    )
    # Load awareness is the draft-length policy's: it prices a round's drafts by the pass they
    # would make for every round in it (adaptive.py). This is a hard cap besides: the target
    # positions one batched pass may verify for all generating requests together; each request
    # drafts at most budget // running - 1 tokens. 0: none; -1 (AUTO, the flag's default): none.
    speculation_token_budget: int = setting(
        0,
        "target positions per batched pass shared by the generating requests: each drafts at most "
        "budget / running - 1 tokens; 0 or auto: no cap (drafts are priced by the pass they make)",
        type="nonnegative_int_or_auto",
        cli_default="auto",
    )
    # A latency objective besides throughput: the draft-length policy drafts no more than keeps a
    # round's predicted wait (the pass it makes for every round in it, adaptive.py) within it.
    itl_slo_ms: float = setting(
        0.0,
        "target gap between streamed chunks, ms: each round drafts at most what keeps its predicted pass "
        "within it (k = 0 where even a plain pass takes longer); 0: none",
        type="seconds",
    )
    # Every round searches the new text for each stop string and holds back any tail that could
    # begin one (coordinator/text.py): the cost grows with their number times their length.
    max_stop_strings: int = 16
    max_stop_chars: int = 256  # the longest stop string
    # The template's text (the flag names its file); None: the target tokenizer's own (coordinator/chat.py).
    chat_template: str | None = setting(
        None,
        "Jinja chat template file for requests that send messages (for a model whose tokenizer has none)",
        metavar="FILE",
        repr=False,
    )


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


class Prepared(NamedTuple):
    """A request ready for its first round."""

    prompt: list[int]  # the prompt's token ids
    request: GenerationRequest  # max_new_tokens filled in, and a seed drawn where sampling had none


class Committed(NamedTuple):
    """What one round adds to the authoritative token list, EOS, stop strings and the length
    limits applied."""

    token_ids: list[int]
    text: str  # the text that became safe to stream (none that could begin a stop string)


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
        self.validator = RequestValidator(target, config, self.chat)
        self.costs = CostModel()  # draft and verify costs, learned from every round of every request
        self.draft_sources: set[str] = set()  # source classes the draft tier has answered with (adaptive.draft_lengths)
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
                first = g.stats.rounds == 0 and not g.policy.fixed  # a fixed k drafts from the start
                lengths = PREFILL if first else g.policy.choose(cap, self.running)
                committed = await self._round(g, cap, lengths)
                g.tokens.extend(committed.token_ids)
                if first_token_s is None and committed.token_ids:
                    first_token_s = self.clock() - started
                reason = self._finish_reason(g.output, g.generated, len(g.tokens), request)
                if reason is None:
                    yield Delta(committed.token_ids, committed.text)
                    continue
                text = committed.text if g.output.stopped else committed.text + g.output.finish()
                g.stats.seconds = self.clock() - started
                observe.end_request(first_token_s, g.stats.seconds, g.generated)
                yield Delta(committed.token_ids, text, reason, len(prompt), g.stats)
                return
        finally:
            self.running -= 1
            await g.drafts.cancel_pipelined()
            await asyncio.gather(
                self._end_draft_session(g.session_id, g.tokens[len(prompt) :]),
                self.verifier.end_session(g.session_id),
            )

    async def _round(self, g: _Generation, cap: int, lengths: DraftLengths) -> Committed:
        """One round, at most `cap` drafts: drafts, one verify pass (the next round's drafts asked
        for meanwhile), commit."""
        with observe.round_span(self.tracer, g.stats.rounds, cap, lengths.why) as span:
            hits = g.drafts.pipelined_hits
            t0 = self.clock()
            drafts = self._in_vocabulary(await g.drafts.propose(g.tokens, lengths.k, lengths.model_k))
            proposal, fallback = drafts.proposal, drafts.fallback
            t1 = self.clock()
            verifying = asyncio.ensure_future(
                self.verifier.verify(g.session_id, g.tokens, proposal, g.request.sampling)
            )
            # The next round's k is not known before this one is verified: ask for this round's,
            # or one if it drafted none (a prefix of a longer draft serves too).
            next_room = g.draft_room(len(g.tokens) + len(proposal.token_ids) + 1)
            next_model_k = g.policy.pipelined_model_k(lengths.model_k)
            g.drafts.prefetch(g.tokens, proposal, drafts.guess, min(max(lengths.k, 1), next_room), next_model_k)
            result = await verifying
            t2 = self.clock()
            committed = Committed(*g.output.add(result.accepted_ids[: g.room()]))
            observe.end_round(
                span, proposed=len(proposal.token_ids), accepted=result.num_accepted,
                committed=len(committed.token_ids),
                fallback=fallback, pipelined=g.drafts.pipelined_hits > hits, draft_s=t1 - t0, verify_s=t2 - t1,
                source=proposal.source if proposal.token_ids else "",
                tree=proposal.parents is not None and not is_chain(proposal.parents),
            )  # fmt: skip
        g.policy.observe(
            lengths, proposal, fallback, result.num_accepted, draft_s=t1 - t0, verify_s=t2 - t1, cost=result.cost
        )
        g.stats.record(len(proposal.token_ids), result.num_accepted)
        g.stats.draft_wait_s += t1 - t0
        g.stats.verify_wait_s += t2 - t1
        g.stats.pipelined_rounds, g.stats.draft_failures = g.drafts.pipelined_hits, g.drafts.failures
        return committed

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

    def prepare(self, request: GenerationRequest) -> Prepared:
        """Validate every field and tokenize the prompt (`RequestValidator.check`: InvalidArgument
        names the first bad field), fill in max_new_tokens, draw a seed where sampling has none."""
        valid = self.validator.check(request)
        if request.max_new_tokens is None:
            request = replace(request, max_new_tokens=valid.max_new_tokens)
        if not request.sampling.greedy and request.sampling.seed is None:
            request = replace(request, sampling=replace(request.sampling, seed=secrets.randbits(63)))
        return Prepared(valid.prompt, request)

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
