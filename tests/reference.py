"""Independent references: target-only decoding by full recomputation, no cache, no engine."""

from __future__ import annotations

import torch

from specdec.core import rng
from specdec.core.rng import Stream
from specdec.core.sampling import SamplingParams, warp


@torch.inference_mode()
def target_only(
    model, prompt: list[int], max_new_tokens: int, eos: frozenset[int], sampling: SamplingParams = SamplingParams()
) -> list[int]:
    """Greedy argmax, or seeded sampling with the same keyed draws the verifier uses."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        logits = model(input_ids=torch.tensor([tokens])).logits[0, -1]  # (vocab,)
        if sampling.greedy:
            token = int(torch.argmax(logits))
        else:
            token = rng.sample(warp(logits, sampling), sampling.seed, len(tokens), Stream.TARGET)
        tokens.append(token)
        if token in eos:
            break
    return tokens[len(prompt) :]
