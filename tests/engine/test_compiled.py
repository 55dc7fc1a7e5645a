"""`--compile`: decode-shaped passes run through the compiled decoder, prefill passes stay eager,
and the verdicts equal the eager engine's; modes a device cannot run are refused by name."""

from __future__ import annotations

import pytest
import torch

from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.runtime.compiled import compile_decoder
from specdec.runtime.ragged import IMPLEMENTATION
from specdec.target_service.verifier import TargetVerifier, VerifyItem

MiB = 1 << 20


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_decode_passes_run_compiled_prefills_eager_and_verdicts_equal_eager(tiny):
    """Three sessions (one sampled) prefill 30-50 tokens, then verify rounds of 0-4 drafts for
    five steps, on an eager and a compiled verifier: every verdict is the same, the compiled
    decoder served exactly the decode-shaped passes (every row at most a verify round's tokens)."""
    loaded = tiny("llama", 3)
    eager = TargetVerifier(loaded, kv_cache_bytes=4 * MiB)
    compiled = TargetVerifier(loaded, kv_cache_bytes=4 * MiB, compile_mode="inductor")
    served: list[int] = []  # packed length of each pass the compiled decoder ran
    decoder = compiled.decoder

    def spy(**inputs):
        served.append(inputs["input_ids"].shape[1])
        return decoder(**inputs)

    compiled.decoder = spy
    sampling = [SamplingParams(), SamplingParams(temperature=0.8, seed=5), SamplingParams()]
    contexts = [_ids(i, n) for i, n in enumerate((30, 41, 50))]
    prefill = [VerifyItem(f"s{i}", c, DraftProposal([]), sampling[i]) for i, c in enumerate(contexts)]
    assert compiled.verify_batch(prefill) == eager.verify_batch(prefill)
    assert served == []  # rows of 30-50 tokens: prefill, eager
    for step in range(5):
        items = [
            VerifyItem(f"s{i}", contexts[i], DraftProposal(_ids(100 * step + i, (step + i) % 5)), sampling[i])
            for i in range(3)
        ]
        got, want = compiled.verify_batch(items), eager.verify_batch(items)
        assert got == want
        for context, result in zip(contexts, got):
            context.extend(result.accepted_ids)
    assert len(served) == 5 and all(3 <= t <= 15 for t in served)


def test_modes_a_device_cannot_run_are_refused_by_name(tiny):
    model = tiny("llama", 3).model
    with pytest.raises(ValueError, match="'cudagraphs' needs a CUDA device"):
        compile_decoder(model, "cudagraphs", IMPLEMENTATION)
    with pytest.raises(ValueError, match="expected one of off, inductor, cudagraphs"):
        compile_decoder(model, "fast", IMPLEMENTATION)
    assert compile_decoder(model, "off", IMPLEMENTATION) is None
