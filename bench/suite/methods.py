"""The ways of decoding the suite compares at batch 1, each a call (prompt ids, new tokens) -> Run.

Ours go through the local stack over gRPC like any client (`stack_method`); the peer is
transformers' own `generate` in this process: greedy, prompt lookup (`prompt_lookup_num_tokens`)
and assisted generation with a draft model (`assistant_model`). Every method decodes greedily
and generates exactly the asked number of tokens (EOS off everywhere, as in
bench/single_process.py), so outputs compare token for token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from specdec.v1 import generation_pb2 as pb
from specdec.v1 import generation_pb2_grpc


@dataclass
class Run:
    token_ids: list[int]
    seconds: float  # wall clock of the whole call, as the caller sees it
    trace_id: str = ""  # ours: the request's trace, for its rounds (bench/suite/spans.py)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.seconds


Method = Callable[[list[int], int], Awaitable[Run]]


def stack_method(stub: generation_pb2_grpc.GenerationServiceStub, speculate: bool, k: int) -> Method:
    async def run(prompt_ids: list[int], max_new_tokens: int) -> Run:
        request = pb.GenerateRequest(
            prompt_token_ids=prompt_ids, max_new_tokens=max_new_tokens, speculation=pb.SpeculationParams(disabled=not speculate, max_draft_tokens=k)
        )
        started = time.perf_counter()
        reply = await stub.Generate(request)
        seconds = time.perf_counter() - started
        s = reply.speculation
        return Run(list(reply.token_ids), seconds, reply.trace_id, s.draft_tokens, s.accepted_tokens, s.rounds)

    return run


def hf_method(model: torch.nn.Module, **generate_kwargs) -> Method:
    """transformers' `generate`, greedy, EOS off; run in a worker thread so the event loop (and
    the stack's servers on it) stays responsive."""

    def call(prompt_ids: list[int], max_new_tokens: int) -> Run:
        input_ids = torch.tensor([prompt_ids])  # (1, prompt)
        with torch.inference_mode():
            started = time.perf_counter()
            out = model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, **generate_kwargs
            )  # (1, prompt + max_new_tokens)
            seconds = time.perf_counter() - started
        return Run(out[0, len(prompt_ids) :].tolist(), seconds)

    async def run(prompt_ids: list[int], max_new_tokens: int) -> Run:
        return await asyncio.to_thread(call, prompt_ids, max_new_tokens)

    return run


def hf_methods(target: torch.nn.Module, k: int, assistant: torch.nn.Module | None) -> dict[str, Method]:
    methods = {"hf_greedy": hf_method(target), "hf_pld": hf_method(target, prompt_lookup_num_tokens=k)}
    if assistant is not None:
        # transformers' adaptive schedule ("heuristic": +2 tokens after a fully accepted draft, -1
        # otherwise, from k), the counterpart of our adaptive k; its default, "constant", keeps
        # drafting k tokens a round however many are rejected.
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "heuristic"
        methods["hf_assisted"] = hf_method(target, assistant_model=assistant)
    return methods
