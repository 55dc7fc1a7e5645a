"""The bf16-screened greedy head gives the argmax of the full fp32 projection, including where
bf16 cannot tell the top tokens apart, and the verifier uses it only where it is exact."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from specdec.core.acceptance import DraftProposal
from specdec.core.errors import NonFiniteLogits
from specdec.core.sampling import SamplingParams
from specdec.runtime import projection
from specdec.runtime.greedy_head import GreedyHead
from specdec.target_service.verifier import TargetVerifier, VerifyItem

MiB = 1 << 20


def _head(vocab: int, d: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    head = nn.Linear(d, vocab, bias=bias)
    return head.requires_grad_(False)


def test_the_verifier_screens_only_plain_fp32_heads_on_a_cpu_with_bf16_instructions():
    """The screen is exact anywhere (the tests below run it on this CPU, whatever it has) but
    faster than the full product only where bf16 runs on its own instructions, not converted to
    fp32 (x86 without AVX-512 BF16 or AMX): only there is it chosen."""
    fast = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() == "x86_64" and cpuinfo.exists():
        flags = set(re.search(r"^flags\s*:(.*)$", cpuinfo.read_text(), re.M).group(1).split())
        fast = fast and bool(flags & {"avx512_bf16", "amx_bf16"})
    assert GreedyHead.supported(nn.Linear(8, 16)) == fast
    assert not GreedyHead.supported(nn.Linear(8, 16).to(torch.bfloat16))
    assert not GreedyHead.supported(nn.Embedding(16, 8))


@pytest.mark.parametrize("bias", [False, True])
@torch.inference_mode()
def test_screened_argmax_equals_the_full_fp32_argmax(bias):
    head = _head(4096, 64, bias, seed=0)
    screen = GreedyHead(head)
    hidden = torch.randn(300, 64) * 3  # (rows, d)
    full = torch.argmax(head(hidden), dim=-1)
    assert torch.equal(screen.argmax(hidden, head), full)


@torch.inference_mode()
def test_near_ties_that_bf16_rounds_together_are_decided_in_fp32():
    """Token 7's weight is token 900's plus 1e-4 along h: in bf16 both rows round alike and the
    screen's logits tie, so only the fp32 recomputation finds 7; and the reverse (900 ahead)."""
    head = _head(1024, 32, False, seed=1)
    hidden = torch.randn(2, 32)
    direction = hidden / hidden.norm(dim=1, keepdim=True)
    w = head.weight
    w[900] = direction[0] * 50
    w[7] = w[900] + 1e-4 * direction[0]
    w[300] = direction[1] * 50
    w[5] = w[300] - 1e-4 * direction[1]
    screen = GreedyHead(head)
    assert screen.argmax(hidden, head).tolist() == [7, 300]
    assert torch.argmax(head(hidden), dim=-1).tolist() == [7, 300]


@torch.inference_mode()
def test_many_near_ties_below_bf16_resolution_give_fp32s_argmax():
    """In each of 64 rows two tokens' logits differ by 2^-12 to 2^-20 of their size, far below
    bf16's 2^-8 (both round to the same bf16 weights), the winner drawn at random: the screen
    returns fp32's argmax in every row, and the winner is not always the lower id."""
    rows, d = 64, 64
    head = _head(8192, d, False, seed=4)
    generator = torch.Generator().manual_seed(4)
    hidden = torch.randn(rows, d, generator=generator)
    direction = hidden / hidden.norm(dim=1, keepdim=True)
    pairs = torch.randperm(8192, generator=generator)[: 2 * rows].view(rows, 2)
    for i, (a, b) in enumerate(pairs.tolist()):
        gap = 2.0 ** -torch.randint(12, 21, (1,), generator=generator).item()
        head.weight[a] = direction[i] * 40
        head.weight[b] = head.weight[a] * (1 + gap)  # b ahead by 40 ||h|| gap along h
        if torch.rand(1, generator=generator).item() < 0.5:
            head.weight[a], head.weight[b] = head.weight[b].clone(), head.weight[a].clone()
    full = torch.argmax(head(hidden), dim=-1)
    screen_logits = torch.nn.functional.linear(hidden.bfloat16(), head.weight.bfloat16())
    at = torch.arange(rows)
    assert (screen_logits[at, pairs[:, 0]] == screen_logits[at, pairs[:, 1]]).float().mean() > 0.9  # bf16 ties them
    assert set(full.tolist()) <= set(pairs.flatten().tolist())  # each row's winner is one of its pair
    assert (full == pairs.min(dim=1).values).any() and (full == pairs.max(dim=1).values).any()
    assert torch.equal(GreedyHead(head).argmax(hidden, head), full)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@torch.inference_mode()
def test_rows_with_nan_or_inf_logits_are_a_clear_error_not_an_out_of_range_id(bad):
    head = _head(1024, 16, False, seed=5)
    hidden = torch.randn(4, 16)
    hidden[2, 3] = bad  # row 2's logits are all NaN or infinite
    with pytest.raises(NonFiniteLogits, match=r"positions \[2\]") as info:
        GreedyHead(head).argmax(hidden, head)
    assert info.value.rows == [2]
    with_bias = _head(1024, 16, True, seed=5)
    with_bias.bias[77] = float("nan")  # one NaN logit in every row: the screen's max is NaN
    with pytest.raises(NonFiniteLogits):
        GreedyHead(with_bias).argmax(torch.randn(3, 16), with_bias)


@torch.inference_mode()
def test_exact_ties_go_to_the_lowest_id_as_torch_argmax_breaks_them():
    head = _head(512, 16, False, seed=2)
    head.weight[400] = head.weight[20] = head.weight[100] * 0 + 5.0
    hidden = torch.ones(1, 16)
    assert torch.argmax(head(hidden), dim=-1).item() == 20
    assert GreedyHead(head).argmax(hidden, head).item() == 20


@torch.inference_mode()
def test_too_many_survivors_fall_back_to_the_full_product():
    """Every token equal: the whole vocabulary survives the screen, past its limit of recomputed
    positions, so the full projection decides (and still breaks the tie to token 0)."""
    head = _head(70_000, 8, False, seed=3)
    head.weight.fill_(0.25)
    calls = []

    def project(h):
        calls.append(h.shape)
        return head(h)

    assert GreedyHead(head).argmax(torch.ones(1, 8), project).item() == 0
    assert calls == [torch.Size([1, 8])]


@torch.inference_mode()
def test_the_verifier_screens_greedy_passes_and_keeps_full_logits_for_sampled(tiny):
    """A verifier on a tiny model holds the screen; greedy and sampled rounds side by side in one
    pass give what each gives alone."""
    loaded = tiny("llama", 1)
    verifier = TargetVerifier(loaded, kv_cache_bytes=4 * MiB)
    assert (verifier.greedy_head is not None) == GreedyHead.supported(loaded.model.get_output_embeddings())
    # The screen's path is what this test is for: on a CPU that would not choose it, install it.
    verifier.greedy_head = GreedyHead(loaded.model.get_output_embeddings())
    prompt = list(range(5, 25))
    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.8, seed=3)
    alone = [
        verifier.verify(f"alone-{i}", prompt, DraftProposal([9, 9]), sampling)
        for i, sampling in enumerate((greedy, sampled))
    ]
    together = verifier.verify_batch(
        [VerifyItem(f"both-{i}", prompt, DraftProposal([9, 9]), s) for i, s in enumerate((greedy, sampled))]
    )
    assert [v.accepted_ids for v in together] == [v.accepted_ids for v in alone]


@torch.inference_mode()
def test_greedy_rounds_reduced_slice_by_slice_decide_as_the_full_logits_do(tiny, monkeypatch):
    """The sliced argmax (a head of several vocabulary slices here) and the full product's argmax
    accept the same tokens, over drafts that are right, wrong and both."""
    monkeypatch.setattr(projection, "VOCAB_SLICE", 64)
    loaded = tiny("llama", 1)
    verifier = TargetVerifier(loaded, kv_cache_bytes=4 * MiB)
    verifier.greedy_head = None
    assert verifier.sliced_argmax
    if torch.backends.mkldnn.is_available():
        assert len(loaded.model.get_output_embeddings()._packed_weight()) == 5  # 259 tokens
    prompts = [list(range(5 + i, 25 + 2 * i)) for i in range(4)]
    drafts = [[], [9, 9], [17, 3, 3], [40]]

    def rounds(sliced: bool, tag: str) -> list[list[int]]:
        verifier.sliced_argmax = sliced
        items = [
            VerifyItem(f"{tag}-{i}", p, DraftProposal(d), SamplingParams())
            for i, (p, d) in enumerate(zip(prompts, drafts))
        ]
        return [v.accepted_ids for v in verifier.verify_batch(items)]

    sliced, full = rounds(True, "sliced"), rounds(False, "full")
    assert sliced == full
    # The drafts the target agrees with are accepted: rerun with the target's own tokens as drafts.
    drafts = [list(ids) for ids in full]
    assert all(len(ids) == len(d) + 1 for ids, d in zip(rounds(True, "own"), drafts))


@torch.no_grad()
def test_the_sliced_argmax_under_a_final_softcap_is_the_capped_logits_argmax(monkeypatch):
    """Capped slice by slice, the argmax is the capped logits' own: where the cap saturates two
    outputs of different slices to one value, the lower id wins, though the raw product ranks
    the other first."""
    monkeypatch.setattr(projection, "VOCAB_SLICE", 64)
    head = projection.use_column_kernels(nn.Linear(4, 200, bias=False))
    head.weight.zero_()
    head.weight[10, 0], head.weight[70, 0], head.weight[150, 0] = 500.0, 600.0, -700.0
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]])
    capped = torch.tanh(head(x) / 2.0) * 2.0
    assert torch.argmax(head(x), dim=-1).tolist() == [70, 150]
    assert torch.argmax(capped, dim=-1).tolist() == [10, 150]
    assert head.argmax(x, softcap=2.0).tolist() == [10, 150]
    assert head.argmax(x).tolist() == [70, 150]
