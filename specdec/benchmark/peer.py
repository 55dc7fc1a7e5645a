"""The peer's ways of decoding at batch 1, each a `specdec.bench.stack.Method`:
(prompt ids, new tokens) -> Run.

Ours go through the local stack over gRPC like any client (`specdec.bench.stack.stack_method`);
the peer is transformers' own `generate` in this process: greedy, prompt lookup
(`prompt_lookup_num_tokens`) and assisted generation with a draft model (`assistant_model`).
Every method decodes greedily and generates exactly the asked number of tokens (EOS off
everywhere, as in bench/single_process.py), so outputs compare token for token.
"""

from __future__ import annotations

import asyncio
import time

import torch

from specdec.benchmark.stack import Method, Run


def hf_method(model: torch.nn.Module, **generate_kwargs) -> Method:
    """transformers' `generate`, greedy, EOS off; run in a worker thread so the event loop (and
    the stack's servers on it) stays responsive."""

    def call(prompt_ids: list[int], max_new_tokens: int) -> Run:
        input_ids = torch.tensor([prompt_ids])  # (1, prompt)
        with torch.inference_mode():
            started = time.perf_counter()
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=None,
                **generate_kwargs,
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
