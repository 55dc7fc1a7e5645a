"""What the draft tier's tests share: tiny-model seeds and prompt, a server and client on
127.0.0.1:0, a gate on the model step, a Propose request builder."""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager
from pathlib import Path

from specdec.coordinator.clients import DraftClient
from specdec.core.sampling import SamplingParams
from specdec.draft_service.server import DraftServer
from specdec.draft_service.service import DraftConfig, DraftCore
from specdec.v1 import common_pb2, draft_pb2

PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]
NEW_TOKENS = 20
TARGET_SEED, DRAFT_SEED = 1, 2  # as in test_engine: tiny models that neither stall nor never repeat
# Sampling values exact in float32 (the wire type), so both sides warp with the very same numbers.
SAMPLED = SamplingParams(temperature=0.75, top_k=50, top_p=0.875, seed=1234)  # small support: sparse q
SAMPLED_DENSE = SamplingParams(temperature=1.0, seed=99)  # full support: dense q
REPO = Path(__file__).resolve().parents[2]


def run(coro, timeout_s: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


@asynccontextmanager
async def serving(loaded, config: DraftConfig = DraftConfig(), **core_args):
    """A DraftServer on 127.0.0.1:0 and a DraftClient to it."""
    server = DraftServer(DraftCore(loaded, config, **core_args))
    port = await server.start("127.0.0.1", 0)
    client = DraftClient(f"127.0.0.1:{port}")
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop(0)


async def until(condition, timeout_s: float = 10.0) -> None:
    """Wait for a condition the test cannot be notified of (another task's progress), bounded."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


def gate(core: DraftCore) -> tuple[threading.Event, threading.Event]:
    """Make the model step wait for `release`; `entered` is set when a step starts."""
    entered, release = threading.Event(), threading.Event()
    original = core.model.propose_batch

    def gated(items):
        entered.set()
        assert release.wait(30)
        return original(items)

    core.model.propose_batch = gated
    return entered, release


def propose_request(session_id="s", committed_len=0, new_tokens=PROMPT, k=4, sampling=None, encoding=0, model_k=None):
    return draft_pb2.ProposeRequest(
        session_id=session_id,
        committed_len=committed_len,
        new_tokens=new_tokens,
        num_draft_tokens=k,
        sampling=sampling or common_pb2.SamplingParams(),
        probs_encoding=encoding,
        model_draft_tokens=model_k,
    )
