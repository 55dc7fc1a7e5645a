"""Column kernels (specdec/projection.py): the same products as F.linear up to float rounding,
for every row count and both sides of the 64-row switch, applied by loading on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdec.projection import _ColumnLinear, column_linear, forward_logits, use_column_kernels


@pytest.mark.parametrize("rows", [1, 2, 3, 9, 64, 65, 300])
def test_column_linear_is_f_linear(rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 48, generator=g)
    weight, bias = torch.randn(200, 48, generator=g), torch.randn(200, generator=g)
    expected = nn.functional.linear(x, weight, bias)
    got = column_linear(x, weight, bias)
    assert got.shape == expected.shape == (1, rows, 200)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(column_linear(x, weight), nn.functional.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_loading_switches_every_linear_and_keeps_weights_and_greedy_tokens(tiny, tiny_dir):
    from transformers import AutoModelForCausalLM

    loaded = tiny("gemma3", 1)
    linears = [m for m in loaded.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is _ColumnLinear for m in linears)
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir("gemma3", 1), dtype=torch.float32).eval()
    assert plain.state_dict().keys() == loaded.model.state_dict().keys()
    ids = torch.tensor([[2, 17, 42, 99, 7, 5, 17, 42, 120, 33]])
    with torch.inference_mode():
        expected = plain(input_ids=ids).logits
        for keep in (1, 3, ids.shape[1]):
            got = forward_logits(loaded.model, keep, input_ids=ids)
            torch.testing.assert_close(got, expected[:, -keep:], rtol=1e-4, atol=1e-4)
            assert torch.equal(got.argmax(-1), expected[:, -keep:].argmax(-1))
    assert use_column_kernels(plain) is plain and all(type(m) is _ColumnLinear for m in plain.modules() if isinstance(m, nn.Linear))
