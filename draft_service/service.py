"""The draft tier without the network: validation, per-session state, the batching queue.

Protocol (see ProposeRequest in protos/specdec/v1/draft.proto): the coordinator owns the token
list. A call names `committed_len`, how many of the tokens it last sent the replica should still
hold, plus `new_tokens`; the full context is stored[:committed_len] + new_tokens. A replica that
holds fewer (never saw the session, evicted it, restarted) raises `SessionMiss` and the caller
resends everything with committed_len = 0. So losing state costs a prefill, never a wrong draft.

One store holds each session's committed tokens *and* the model drafter's KV cache (handed to
`ModelDrafter` through a view), so one LRU/TTL/token bound covers all the memory a session pins
and the two can never disagree about which sessions exist.

Every drafter is reached through the `Drafter` contract (drafter.py), built by registry.py.
Model calls are batched continuously: a model drafter's step queues its call, and one worker
takes whatever is waiting (up to `max_batch`, one call per session) whenever the model is free,
and runs `ModelDrafter.propose_batch` in a thread. Lookups (the n-gram and suffix drafters, a
hybrid's lookup rounds) need no model and are answered inline. A drafter that learns (suffix
decoding) observes each request's completion at its `end_session`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specdec.core.acceptance import DraftProposal
from specdec.core.errors import InvalidArgument
from specdec.core.sampling import SamplingParams
from specdec.core.session_store import SessionStore
from specdec.core.settings import setting
from specdec.draft_service import metrics
from specdec.draft_service.drafter import DraftRequest
from specdec.draft_service.hybrid import HybridConfig
from specdec.draft_service.registry import build_drafter
from specdec.draft_service.suffix import SuffixConfig

if TYPE_CHECKING:  # transformers takes seconds to import; an n-gram replica never needs it
    from specdec.draft_service.model_drafter import ModelDrafter
    from specdec.runtime.kv_pool import PagedSession
    from specdec.runtime.models import LoadedModel


@dataclass(frozen=True)
class DraftConfig:
    max_draft_tokens: int = setting(32, "largest k a call may ask for", type="positive_int")
    max_batch: int = setting(16, "most Propose calls one batched model step serves", type="positive_int")
    max_queue: int = setting(256, "calls waiting for the model beyond this get RESOURCE_EXHAUSTED", type="positive_int")
    max_sessions: int = setting(
        256, "sessions kept per replica (least recently used evicted beyond)", type="positive_int"
    )
    # Gemma 3 270M in fp32 holds at most 18 layers x 2 x 256 x 4 B = 36 KiB of KV per position,
    # so 65,536 positions is ~2.3 GiB.
    max_cached_tokens: int = setting(65536, "token positions kept over all sessions (LRU beyond)", type="positive_int")
    # Idle sessions (their coordinator died) expire after this; None (the flag's 0): never.
    session_ttl_s: float | None = setting(
        300.0, "seconds an idle session is kept; 0 keeps it until LRU evicts it", type="seconds"
    )
    # None: the draft's own threshold (a distilled draft's draft.json), else 0 (off).
    min_confidence: float | None = setting(
        None,
        "greedy model drafts stop before a token the draft gives less probability than this (model_drafter.py); "
        "0 = off, auto = the draft's own (a distilled draft's draft.json), else off",
        type="probability_or_auto",
        cli_default="auto",
    )


class SessionMiss(Exception):
    """The replica does not hold `committed_len` tokens of the session: resend the full context."""


class SessionEnded(Exception):
    """The session was ended: a Propose that reaches the replica after its EndSession (the caller
    cancelled it, and the two calls raced) must not bring the session back for its TTL."""


class Overloaded(Exception):
    """More than `max_queue` calls are waiting for the model."""


class DeadlineExpired(Exception):
    """The call's deadline passed before its work started."""


@dataclass
class ProposeCall:
    session_id: str
    committed_len: int  # tokens of the last context sent that the caller builds on
    new_tokens: list[int]  # appended after them
    k: int  # draft tokens wanted
    sampling: SamplingParams
    timeout_s: float | None = None  # seconds left for the call; None: no deadline
    model_k: int | None = None  # most tokens the draft model may propose (model_draft_tokens); None: k
    tree: bool = False  # the answer may be a token tree of up to k nodes (drafters that draft trees)


@dataclass
class ProposeResult:
    proposal: DraftProposal  # draft_probs only for sampled calls to the model drafter
    cached_len: int  # committed tokens the replica holds for the session after the call
    suffix: str = ""  # where a suffix lookup found its draft: "context", "cache", "none"; "" when none ran


@dataclass
class DraftSession:
    tokens: list[int]  # the committed context this replica was last sent
    cache: PagedSession | None = None  # model drafter only; its tokens run k-1 drafts past `tokens`


def _positions(session: DraftSession) -> int:
    # The cache and the token list cover the same positions (the cache a few drafts more), so a
    # session's cost is the longer of the two, not their sum.
    return max(len(session.tokens), len(session.cache.tokens) if session.cache else 0)


@dataclass
class DraftStats:
    calls: int = 0  # Propose calls that drafted
    misses: int = 0  # SessionMiss answers
    batches: int = 0  # model steps (propose_batch calls)
    batched_calls: int = 0  # calls served by those steps
    max_batch_size: int = 0
    expired: int = 0  # calls dropped unstarted: deadline passed while queued
    peak_sessions: int = 0  # most sessions held after any call (bounded by max_sessions)
    peak_cached_tokens: int = 0  # most token positions held after any call (bounded by max_cached_tokens)


_ENDED_KEPT = 65536  # ended session ids remembered (about 100 bytes each)


@dataclass
class _Pending:
    item: DraftRequest  # its deadline on the core's clock
    future: asyncio.Future


class DraftCore:
    """Proposals for many sessions from one drafter (registry.py): `loaded` None means a lookup
    alone (n-gram, or suffix decoding with `suffix`)."""

    def __init__(
        self,
        loaded: LoadedModel | None,
        config: DraftConfig = DraftConfig(),
        clock: Callable[[], float] = time.monotonic,
        hybrid: HybridConfig | None = None,  # n-gram rounds where the context repeats, the model elsewhere
        suffix: SuffixConfig | None = None,  # suffix decoding instead of n-gram lookup (alone or in the hybrid)
    ):
        self.config = config
        self.clock = clock
        self.store: SessionStore[DraftSession] = SessionStore(
            config.max_sessions, config.max_cached_tokens, config.session_ttl_s, size=_positions, clock=clock
        )
        self.stats = DraftStats()
        _export_store(self.store)
        self.model: ModelDrafter | None = None if loaded is None else _model_drafter(loaded, config, self.store)
        self.drafter = build_drafter(self.model, self._draft, hybrid=hybrid, suffix=suffix)
        self.vocab_size = None if loaded is None else loaded.vocab_size
        self.max_context = None if loaded is None else loaded.max_context
        # Session ids ended lately -> when, at most _ENDED_KEPT of them and none older than the TTL:
        # the ids are unique per request, and any call for one after its EndSession comes from a
        # caller that has gone (cancelled calls reach the server in no guaranteed order).
        self._ended: OrderedDict[str, float] = OrderedDict()
        self._queue: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    async def propose(self, call: ProposeCall) -> ProposeResult:
        if call.timeout_s is not None and call.timeout_s <= 0:
            raise DeadlineExpired("deadline passed before the call arrived")
        deadline = None if call.timeout_s is None else self.clock() + call.timeout_s
        self.validate(call)
        if call.session_id in self._ended:
            raise SessionEnded(f"session {call.session_id!r} was ended")
        context = self._context(call)
        sampling = call.sampling
        if not sampling.greedy and sampling.seed is None:
            sampling = replace(sampling, seed=secrets.randbits(63))  # unset on the wire: nondeterministic
        self._remember(call.session_id, context)
        # Never draft past the draft model's context; fewer tokens is a valid proposal.
        k = call.k if self.max_context is None else min(call.k, self.max_context - len(context))
        request = DraftRequest(call.session_id, context, k, sampling, call.model_k, call.tree, deadline)
        drafted = await self.drafter.propose(request)
        if drafted.found_in:
            metrics.SUFFIX_LOOKUPS.labels(drafted.found_in).inc()
        proposal = drafted.proposal
        metrics.DRAFT_ROUNDS.labels(proposal.source).inc()
        self.stats.calls += 1
        metrics.DRAFT_TOKENS.inc(len(proposal.token_ids))
        self._gauges()
        session = self.store.get(call.session_id)
        return ProposeResult(proposal, len(session.tokens) if session is not None else 0, drafted.found_in)

    def validate(self, call: ProposeCall) -> None:
        """InvalidArgument naming the first bad field (proto field paths)."""
        if not call.session_id:
            raise InvalidArgument("session_id", "is empty")
        if not 1 <= call.k <= self.config.max_draft_tokens:
            raise InvalidArgument("num_draft_tokens", f"must be in [1, {self.config.max_draft_tokens}], got {call.k}")
        if call.model_k is not None and not 0 <= call.model_k <= call.k:
            raise InvalidArgument(
                "model_draft_tokens", f"must be in [0, num_draft_tokens = {call.k}], got {call.model_k}"
            )
        call.sampling.validate()
        self._check_token_ids("new_tokens", call.new_tokens)
        if call.committed_len == 0 and not call.new_tokens:
            raise InvalidArgument("new_tokens", "the context is empty (committed_len 0 and no new tokens)")

    def _check_token_ids(self, field: str, tokens: Sequence[int]) -> None:
        """InvalidArgument naming `field` for the first id outside the vocabulary (>= 0 when unknown)."""
        limit = self.vocab_size
        bad = [t for t in tokens if t < 0 or (limit is not None and t >= limit)]
        if bad:
            where = f"[0, {limit})" if limit is not None else ">= 0"
            raise InvalidArgument(field, f"token id {bad[0]} is outside {where}")

    def end_session(self, session_id: str, completion: Sequence[int] = ()) -> None:
        """Free the session; a drafter that learns observes its completion (the request's output)."""
        if not session_id:
            raise InvalidArgument("session_id", "is empty")
        if session_id not in self._ended:
            if self.drafter.capabilities.learns:
                self._check_token_ids("completion_token_ids", completion)
            learned = self.drafter.observe(session_id, completion)
            if learned is not None:
                metrics.SUFFIX_CACHE_TOKENS.set(learned.tokens)
                metrics.SUFFIX_CACHE_BYTES.set(learned.nbytes)
        self.drafter.end(session_id)
        self.store.pop(session_id, None)
        now = self.clock()
        self._ended[session_id] = now
        self._ended.move_to_end(session_id)
        ttl = self.config.session_ttl_s
        while self._ended and (
            len(self._ended) > _ENDED_KEPT or (ttl is not None and next(iter(self._ended.values())) < now - ttl)
        ):
            self._ended.popitem(last=False)
        self._gauges()

    def _gauges(self) -> None:
        self.stats.peak_sessions = max(self.stats.peak_sessions, len(self.store))
        self.stats.peak_cached_tokens = max(self.stats.peak_cached_tokens, self.store.total_tokens)
        metrics.QUEUE_DEPTH.set(len(self._queue))

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        for pending in self._queue:
            if not pending.future.done():
                pending.future.cancel()
        self._queue.clear()

    def _context(self, call: ProposeCall) -> list[int]:
        if call.committed_len == 0:
            return list(call.new_tokens)
        session = self.store.get(call.session_id)
        if session is None or len(session.tokens) < call.committed_len:
            self.stats.misses += 1
            held = "no state" if session is None else f"{len(session.tokens)} tokens"
            raise SessionMiss(f"session {call.session_id!r}: replica holds {held}, call builds on {call.committed_len}")
        return session.tokens[: call.committed_len] + list(call.new_tokens)

    def _remember(self, session_id: str, context: list[int]) -> None:
        session = self.store.get(session_id) or DraftSession([])
        session.tokens = context  # the drafter's cache keeps its own tokens and finds the common prefix itself
        self.store[session_id] = session  # recounted, most recently used, others evicted to fit

    async def _draft(self, item: DraftRequest) -> DraftProposal:
        """The model drafters' step (`ModelStep`): the call waits in the queue for a batch."""
        if len(self._queue) >= self.config.max_queue:
            self._queue = deque(p for p in self._queue if not p.future.done())  # callers that left hold no place
        if len(self._queue) >= self.config.max_queue:
            raise Overloaded(
                f"{len(self._queue)} calls already wait for the draft model (max_queue {self.config.max_queue})"
            )
        if self._worker is None:
            self._wakeup = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._work())
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(item, future))
        metrics.QUEUE_DEPTH.set(len(self._queue))
        self._wakeup.set()
        return await future  # a cancelled caller cancels the future; the worker then skips it

    async def _work(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while batch := self._take_batch():
                await self._run(batch)

    def _take_batch(self) -> list[_Pending]:
        """Whatever is waiting, up to max_batch, at most one call per session (two calls of one
        session would share its cache); the rest keep their place."""
        batch: list[_Pending] = []
        sessions: set[str] = set()
        waiting: deque[_Pending] = deque()
        now = self.clock()
        for pending in self._queue:
            if pending.future.done():
                continue  # its caller went away (cancelled, or its deadline fired)
            if pending.item.deadline is not None and pending.item.deadline <= now:
                self.stats.expired += 1
                pending.future.set_exception(DeadlineExpired("deadline passed while queued"))
            elif len(batch) < self.config.max_batch and pending.item.session_id not in sessions:
                batch.append(pending)
                sessions.add(pending.item.session_id)
            else:
                waiting.append(pending)
        self._queue = waiting
        return batch

    async def _run(self, batch: list[_Pending]) -> None:
        items = [pending.item for pending in batch]
        try:
            proposals = await asyncio.to_thread(self.model.propose_batch, items)
        except Exception as error:  # noqa: BLE001 - delivered to every caller of the batch
            for pending in batch:
                self._drop_cache(pending.item.session_id)  # half-fed caches cannot be trusted
                if not pending.future.done():
                    pending.future.set_exception(error)
            return
        self.stats.batches += 1
        metrics.BATCH_SIZE.observe(len(batch))
        self.stats.batched_calls += len(batch)
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(batch))
        for pending, proposal in zip(batch, proposals):
            self.store.resize(pending.item.session_id)  # the cache grew by the context and the drafts
            if not pending.future.done():
                pending.future.set_result(proposal)

    def _drop_cache(self, session_id: str) -> None:
        session = self.store.get(session_id)
        if session is not None and session.cache is not None:
            self.model.release(session.cache)
            session.cache = None
            self.store.resize(session_id)


def _model_drafter(loaded: LoadedModel, config: DraftConfig, store: SessionStore[DraftSession]) -> ModelDrafter:
    """The draft model over the store's sessions: the store's bound covers its KV too."""
    from specdec.draft_service.model_drafter import ModelDrafter
    from specdec.runtime.kv_pool import BLOCK_SIZE, KVShape

    # The pool holds what the store may keep (max_cached_tokens), plus each session's last
    # part-filled block and a batch's drafts beyond it before the store trims to fit.
    positions = config.max_cached_tokens + (config.max_sessions + config.max_batch) * BLOCK_SIZE
    dtype = next(loaded.model.parameters()).dtype
    kv_bytes = positions * KVShape.of(loaded.model.config).bytes_per_token(dtype)
    model = ModelDrafter(
        loaded, sessions=_CacheView(store), min_confidence=config.min_confidence, kv_cache_bytes=kv_bytes
    )
    store.on_remove = lambda session: session.cache is not None and model.release(session.cache)
    return model


def _export_store(store: SessionStore) -> None:
    """The sessions and cached-tokens gauges read the store when scraped, not when a call last
    ran: a replica whose coordinator died gets no more calls, and a scrape is then what expires
    its sessions by TTL and shows them gone (a pushed value would keep them on the dashboard
    forever)."""
    ref = weakref.ref(store)  # the gauge must not keep a closed core's store alive

    def held(what: str) -> int:
        current = ref()
        if current is None:
            return 0
        sessions = len(current)  # expires what outlived its TTL
        return sessions if what == "sessions" else current.total_tokens

    metrics.SESSIONS.set_function(lambda: held("sessions"))
    metrics.CACHE_TOKENS.set_function(lambda: held("tokens"))


class _CacheView(MutableMapping[str, "PagedSession"]):
    """The store seen as the `sessions` mapping `ModelDrafter` expects: session id -> KV cache."""

    def __init__(self, store: SessionStore[DraftSession]):
        self.store = store

    def __getitem__(self, session_id: str) -> PagedSession:
        session = self.store[session_id]
        if session.cache is None:
            raise KeyError(session_id)
        return session.cache

    def __setitem__(self, session_id: str, cache: PagedSession) -> None:
        session = self.store.get(session_id)
        if session is None:
            # Evicted since the call began: the drafter still holds this cache for the call, then it
            # is gone (a miss).
            return
        session.cache = cache
        self.store.resize(session_id)

    def __delitem__(self, session_id: str) -> None:
        session = self.store.get(session_id)
        if session is None or session.cache is None:
            raise KeyError(session_id)
        session.cache = None
        self.store.resize(session_id)

    def __iter__(self) -> Iterator[str]:
        return iter([sid for sid in self.store if (s := self.store.peek(sid)) is not None and s.cache is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)
