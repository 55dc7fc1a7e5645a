"""The benchmarks' handle on a running local stack: a coordinator per arm over its tiers, and the
Method that calls one over gRPC and returns a Run with the engine's own clocks. `specdec bench`
and the component benchmarks (bench/stack.py, drafters.py, tracing.py, ...) measure through it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import grpc
from opentelemetry import trace

from specdec.coordinator.clients import DraftClient
from specdec.coordinator.engine import EngineConfig, SpeculativeEngine
from specdec.coordinator.remote import connect_engine
from specdec.coordinator.server import GenerationServer, ServerConfig
from specdec.drafts.truncate import first_layers_dir
from specdec.local.stack import LocalStack
from specdec.target_service.pool import PoolConfig, TargetPool
from specdec.v1 import generation_pb2 as pb
from specdec.v1 import generation_pb2_grpc


@dataclass
class Run:
    token_ids: list[int]
    seconds: float  # wall clock of the whole call, as the client sees it
    # What our engine reports (zero for a call that is not ours, transformers' in peer.py):
    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    pipelined_rounds: int = 0
    draft_wait_s: float = 0.0
    verify_wait_s: float = 0.0
    generation_s: float = 0.0  # the engine's first round to its last token
    trace_id: str = ""  # through the stack: the request's trace (spans.py reads its rounds)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.seconds

    def split(self) -> dict[str, float]:
        """Shares of the wall time: draft wait, verify wait, coordinator, outside the engine."""
        coordinator = max(0.0, self.generation_s - self.draft_wait_s - self.verify_wait_s)
        outside = max(0.0, self.seconds - self.generation_s)
        return {
            "draft": self.draft_wait_s / self.seconds,
            "verify": self.verify_wait_s / self.seconds,
            "coordinator": coordinator / self.seconds,
            "outside": outside / self.seconds,
        }


Method = Callable[[list[int], int], Awaitable[Run]]  # (prompt ids, max_new_tokens) -> Run


def drafter_spec(drafter: str, target_model: str | None) -> str:
    """What the draft server and the single-process engine load for a --drafter value."""
    if drafter.startswith("first:"):
        return str(first_layers_dir(target_model, int(drafter.removeprefix("first:"))))
    return drafter


def stack_method(stub: generation_pb2_grpc.GenerationServiceStub, speculate: bool, k: int) -> Method:
    async def run(prompt_ids: list[int], max_new_tokens: int) -> Run:
        request = pb.GenerateRequest(
            prompt_token_ids=prompt_ids,
            max_new_tokens=max_new_tokens,
            speculation=pb.SpeculationParams(disabled=not speculate, max_draft_tokens=k),
        )
        started = time.perf_counter()
        reply = await stub.Generate(request)
        seconds = time.perf_counter() - started
        s = reply.speculation
        return Run(
            list(reply.token_ids), seconds, s.rounds, s.draft_tokens, s.accepted_tokens, s.pipelined_rounds,
            s.draft_wait_seconds, s.verify_wait_seconds, s.generation_seconds, reply.trace_id,
        )  # fmt: skip

    return run


@asynccontextmanager
async def coordinators(
    stack: LocalStack,
    target_model: str | None,
    arms: dict[str, tuple[EngineConfig, trace.Tracer | None]],
    drafts: dict[str, DraftClient] | None = None,
) -> AsyncIterator[dict[str, generation_pb2_grpc.GenerationServiceStub]]:
    """A coordinator per arm over the running stack's tiers (EOS off: every call generates
    exactly max_new_tokens), each on a free loopback port; yields a stub per arm. An arm named
    in `drafts` uses that draft tier instead of the stack's."""
    pool = TargetPool(PoolConfig(prefix=stack.config.pool_name, namespace=stack.config.namespace))
    remote = replace((await connect_engine(stack.draft, pool, target_model)).target, eos_token_ids=frozenset())
    servers: list[GenerationServer] = []
    channels: list[grpc.aio.Channel] = []
    stubs = {}
    try:
        for name, (config, tracer) in arms.items():
            draft = (drafts or {}).get(name, stack.draft)
            servers.append(
                GenerationServer(
                    SpeculativeEngine(draft, pool, remote, config, tracer), ServerConfig(port=0), tracer=tracer
                )
            )
            channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{await servers[-1].start()}"))
            stubs[name] = generation_pb2_grpc.GenerationServiceStub(channels[-1])
        yield stubs
    finally:
        for channel in channels:
            await channel.close()
        for server in servers:
            await server.stop(0)
