"""Remote tiers behind the engine's interfaces: `DraftClient` is a Proposer over gRPC.

Incremental context: the client remembers, per session, the tokens it last sent and which
replica holds them, and sends only what follows the common prefix (`committed_len`). Drafts are
never counted as committed: the replica held exactly the context it was sent. A replica that
lost the session answers FAILED_PRECONDITION "session miss"; the client resends the whole
context once, and the replica prefills. Any other error propagates to the engine.

Replica affinity: a `dns:///name:port` target resolves to every address behind the name (a
headless Kubernetes service gives one per pod), re-resolved every `resolve_every_s`; each
session goes to the replica that wins rendezvous hashing (highest hash of session id + address),
so a session stays on one replica, sessions spread evenly, and adding or removing a replica only
moves the sessions that hashed to it (they miss once and prefill). A request's cache-affinity key,
when it has one, takes the session id's place, so requests of one kind share a replica.

Failover: with several replicas, each one's health is checked every `health_every_s`; a replica
that fails a call in transport (UNAVAILABLE, DEADLINE_EXCEEDED) or does not answer SERVING is
skipped until it does, and its sessions go to their next-ranked replica (a miss there, then the
whole context): the failed call is retried there at once, so the round keeps its drafts.

With `auth_token` set, every call carries `authorization: Bearer <token>`: a draft server started
with the same `--auth-token` refuses calls without it.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors, filters

from specdec.core import draft_source
from specdec.core.acceptance import DraftProposal
from specdec.core.draft_source import model_draft_limit
from specdec.core.packing import unpack_probs
from specdec.core.sampling import SamplingParams
from specdec.core.wire import MAX_PROPOSE_REQUEST_BYTES, MAX_PROPOSE_RESPONSE_BYTES, SESSION_MISS, channel_options
from specdec.runtime.kv_pool import common_prefix
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

_DRAFT_SERVICE = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name
# A call that failed with these found its replica gone, stalled or draining: try the next one.
_REPLICA_DOWN = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class DraftClientConfig:
    timeout_s: float = 5.0  # deadline of each Propose / EndSession
    keepalive_time_s: float = 30.0  # ping an idle connection this often, to notice dead peers
    keepalive_timeout_s: float = 10.0  # a ping unanswered this long closes the connection
    resolve_every_s: float = 30.0  # re-resolve a dns:/// target this often (pods come and go)
    probs_encoding: int = common_pb2.DRAFT_PROBS_ENCODING_UNSPECIFIED  # the server picks the smaller exact form
    max_receive_bytes: int = MAX_PROPOSE_RESPONSE_BYTES  # a response may carry dense q
    max_send_bytes: int = MAX_PROPOSE_REQUEST_BYTES  # a Propose carries token ids: a context at most
    # gRPC's default reconnect backoff starts at 1 s and grows to 120 s; a restarted draft pod is
    # back in seconds, and until the channel reconnects every request decodes without drafts.
    reconnect_backoff_s: tuple[float, float] = (0.2, 5.0)  # (first, largest)
    auth_token: str | None = field(default=None, repr=False)  # the draft tier's --auth-token; None sends none
    health_every_s: float = 1.0  # with several replicas, check each one's health this often
    health_timeout_s: float = 1.0  # a health check unanswered this long counts the replica down


@dataclass
class _Sent:
    address: str  # the replica that holds it
    tokens: list[int]  # the context it holds for the session (what we last sent, as it confirmed)


class DraftClient:
    def __init__(self, target: str | Sequence[str], config: DraftClientConfig = DraftClientConfig()):
        """target: "host:port", a list of them (one replica each), or "dns:///name:port" (every
        address the name resolves to)."""
        self.config = config
        self._dns: tuple[str, int] | None = None
        self._addresses: list[str] = []
        if isinstance(target, str) and target.startswith("dns:///"):
            host, _, port = target[len("dns:///") :].rpartition(":")
            self._dns = (host.strip("[]"), int(port))
        else:
            self._addresses = [target] if isinstance(target, str) else list(target)
        if not self._dns and not self._addresses:
            raise ValueError("DraftClient needs at least one address")
        self._resolved_at = -float("inf")
        self._channels: dict[str, tuple[grpc.aio.Channel, draft_pb2_grpc.DraftServiceStub]] = {}
        self._sessions: dict[str, _Sent] = {}
        self._closing: set[asyncio.Future] = set()
        self.misses = 0  # session-miss answers that led to a full resend
        self.failovers = 0  # calls moved to the next-ranked replica after theirs failed
        self._down: set[str] = set()  # replicas skipped until their health check answers SERVING
        self._health: asyncio.Task | None = None
        self._metadata = (("authorization", f"Bearer {config.auth_token}"),) if config.auth_token else None

    async def propose(
        self,
        session_id: str,
        tokens: Sequence[int],
        k: int,
        sampling: SamplingParams,
        model_k: int | None = None,
        affinity: str = "",
        tree: bool = False,
    ) -> DraftProposal:
        """`affinity`: the request's cache-affinity key; the replica is chosen by it instead of the
        session id, so every request with the key drafts on one replica. `tree`: the answer may
        be a token tree of up to k nodes."""
        tokens = list(tokens)
        key = affinity or session_id
        address = await self._replica(key)
        try:
            return await self._propose_on(address, session_id, tokens, k, sampling, model_k, tree)
        except grpc.aio.AioRpcError as e:
            if e.code() not in _REPLICA_DOWN or len(self._addresses) < 2:
                raise
            # The replica is down or stalled: skip it until its health says SERVING again, and ask
            # the next-ranked one now (it misses the session and takes the whole context).
            self._down.add(address)
            self.failovers += 1
            fallback = await self._replica(key)
            if fallback == address:
                raise
            return await self._propose_on(fallback, session_id, tokens, k, sampling, model_k, tree)

    async def _propose_on(
        self,
        address: str,
        session_id: str,
        tokens: list[int],
        k: int,
        sampling: SamplingParams,
        model_k: int | None,
        tree: bool = False,
    ) -> DraftProposal:
        sent = self._sessions.get(session_id)
        committed = common_prefix(sent.tokens, tokens) if sent is not None and sent.address == address else 0
        if sent is None or sent.address != address:
            # The replica holds the session from the moment it receives the call: end_session must
            # reach it even when this first call is cancelled before it answers.
            self._sessions[session_id] = _Sent(address, [])
        try:
            response = await self._propose(address, session_id, tokens, committed, k, sampling, model_k, tree)
        except grpc.aio.AioRpcError as e:
            if (
                committed == 0
                or e.code() != grpc.StatusCode.FAILED_PRECONDITION
                or not (e.details() or "").startswith(SESSION_MISS)
            ):
                raise
            self.misses += 1
            response = await self._propose(address, session_id, tokens, 0, k, sampling, model_k, tree)
        self._sessions[session_id] = _Sent(address, tokens[: response.cached_len])
        token_ids = list(response.token_ids)
        q = None
        if response.HasField("draft_probs"):
            q = unpack_probs(response.draft_probs, num_tokens=len(token_ids))  # (k, draft vocab)
        parents = list(response.parent_indices) or None
        if parents is not None and (q is not None or len(parents) != len(token_ids)):
            raise ValueError(f"a draft tree of {len(parents)} parents for {len(token_ids)} tokens, q {q is not None}")
        return DraftProposal(token_ids, q, draft_source.from_proto(response.source), parents)

    async def end_session(self, session_id: str, completion: Sequence[int] = ()) -> None:
        """Best effort: a replica we cannot reach drops the session by TTL or LRU anyway, and a
        finished generation must not fail on its cleanup. `completion` feeds a suffix cache: a
        request that never drafted (speculation off, or priced out by load) still teaches it
        what was generated, at the replica its drafts would have gone to."""
        sent = self._sessions.pop(session_id, None)
        if sent is None and completion:
            try:
                sent = _Sent(await self._replica(session_id), [])
            except OSError:  # the tier's name resolves to nothing yet: no replica to teach
                return
        if sent is None or sent.address not in self._channels:
            return
        try:
            await self._channels[sent.address][1].EndSession(
                draft_pb2.EndSessionRequest(session_id=session_id, completion_token_ids=completion),
                timeout=self.config.timeout_s,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError:
            pass

    async def close(self) -> None:
        if self._health is not None:
            self._health.cancel()
            await asyncio.gather(self._health, return_exceptions=True)
            self._health = None
        channels = [channel for channel, _ in self._channels.values()]
        self._channels.clear()
        await asyncio.gather(*(channel.close() for channel in channels), *self._closing)

    async def __aenter__(self) -> DraftClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _propose(
        self,
        address: str,
        session_id: str,
        tokens: list[int],
        committed: int,
        k: int,
        sampling: SamplingParams,
        model_k: int | None,
        tree: bool = False,
    ) -> draft_pb2.ProposeResponse:
        request = draft_pb2.ProposeRequest(
            session_id=session_id,
            committed_len=committed,
            new_tokens=tokens[committed:],
            num_draft_tokens=k,
            sampling=_sampling_to_proto(sampling),
            probs_encoding=self.config.probs_encoding,
            model_draft_tokens=None if model_k is None else model_draft_limit(k, model_k),
            tree=tree,
        )
        return await self._channels[address][1].Propose(request, timeout=self.config.timeout_s, metadata=self._metadata)

    async def _replica(self, key: str) -> str:
        """The replica for `key`: rendezvous hashing over the replicas not skipped as down (so a
        down replica's keys go to their next-ranked replica, and come back with its health)."""
        if self._dns is not None and time.monotonic() - self._resolved_at >= self.config.resolve_every_s:
            await self._resolve()
        if not self._channels:
            for address in self._addresses:
                self._open(address)
        if self._health is None and len(self._addresses) > 1:
            self._health = asyncio.get_running_loop().create_task(self._watch_health())
        live = [address for address in self._addresses if address not in self._down]
        return pick_replica(key, live or self._addresses)

    async def _watch_health(self) -> None:
        """Check every replica's health every `health_every_s`: one that does not answer SERVING
        in time (down, stalled, draining) is skipped until it does again."""
        while True:
            addresses = [a for a in self._addresses if a in self._channels]
            states = await asyncio.gather(*(self._serving(self._channels[a][0]) for a in addresses))
            for address, serving in zip(addresses, states):
                if serving:
                    self._down.discard(address)
                else:
                    self._down.add(address)
            await asyncio.sleep(self.config.health_every_s)

    async def _serving(self, channel: grpc.aio.Channel) -> bool:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=self.config.health_timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def _resolve(self) -> None:
        host, port = self._dns
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            if not self._addresses:
                raise
            return  # keep the replicas we know; try again on the next call
        addresses = sorted({_join(info[4][0], port) for info in infos})
        self._resolved_at = time.monotonic()
        for gone in set(self._channels) - set(addresses):
            channel, _ = self._channels.pop(gone)
            closing = asyncio.ensure_future(channel.close(grace=self.config.timeout_s))  # its calls in flight finish
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        for address in addresses:
            if address not in self._channels:
                self._open(address)
        self._addresses = addresses

    def _open(self, address: str) -> None:
        c = self.config
        options = channel_options(
            keepalive_time_s=c.keepalive_time_s,
            keepalive_timeout_s=c.keepalive_timeout_s,
            max_receive_bytes=c.max_receive_bytes,
            max_send_bytes=c.max_send_bytes,
            reconnect_backoff_s=c.reconnect_backoff_s,
        )
        # The OpenTelemetry interceptor opens a client span per call and sends its context in the
        # metadata, so the draft server's span joins the round's trace.
        channel = grpc.aio.insecure_channel(
            address, options=options, interceptors=aio_client_interceptors(filter_=filters.service_name(_DRAFT_SERVICE))
        )
        self._channels[address] = (channel, draft_pb2_grpc.DraftServiceStub(channel))


def pick_replica(session_id: str, addresses: Sequence[str]) -> str:
    """Rendezvous (highest-random-weight) hashing: stable across processes, unlike hash()."""
    return max(
        addresses, key=lambda address: hashlib.blake2b(f"{session_id}\0{address}".encode(), digest_size=8).digest()
    )


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _sampling_to_proto(sampling: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    if sampling.seed is not None:
        msg.seed = sampling.seed
    return msg
