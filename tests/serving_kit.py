"""What tests of the public API servers share: a bounded wait for server-side cleanup, an
engine stand-in that holds every request until released, and a server around a stand-in."""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager

from loop_thread import LoopThread

from specdec.coordinator.engine import Delta, FinishReason, SpeculationStats
from specdec.coordinator.server import GenerationServer, ServerConfig


def until(condition, timeout_s: float = 10.0) -> None:
    """Wait for what the test cannot be notified of (the server's cleanup after a call), bounded."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


class GatedEngine:
    """Stands in for the engine: every stream waits for `release`, then gives one token, "x"
    (the server only translates)."""

    def __init__(self):
        self.release = asyncio.Event()
        self.entered = 0
        self.target = type("Target", (), {"name": "gated", "max_context": 64})()

    async def stream(self, request):
        self.entered += 1
        await self.release.wait()
        yield Delta([7], "x", FinishReason.LENGTH, 1, SpeculationStats())


class HeldCleanupEngine:
    """Stands in for the engine: every stream gives one token, "x", at once; the first stream's
    cleanup after its last delta (where the real engine ends its sessions on both tiers) then waits
    for `release`."""

    def __init__(self):
        self.release = asyncio.Event()
        self.entered = 0
        self.cleaned = 0
        self.target = type("Target", (), {"name": "held", "max_context": 64})()

    async def stream(self, request):
        self.entered += 1
        first = self.entered == 1
        try:
            yield Delta([7], "x", FinishReason.LENGTH, 1, SpeculationStats())
        finally:
            if first:
                await self.release.wait()
            self.cleaned += 1


@contextmanager
def serving(engine, **config):
    """`engine` behind a `GenerationServer` on free loopback ports (`config`: more ServerConfig
    fields), in a loop thread of its own: yields (loop, server); both stop on exit."""
    loop = LoopThread()

    async def start() -> GenerationServer:  # grpc.aio wants the loop it serves on
        server = GenerationServer(engine, ServerConfig(port=0, **config))
        await server.start()
        return server

    try:
        server = loop.run(start())
        try:
            yield loop, server
        finally:
            loop.run(server.stop(0))
    finally:
        loop.close()
