"""Column kernels and oneDNN's packed kernels (specdec/runtime/projection.py): the same products
as F.linear up to float rounding, for every row count and both sides of each switch, applied by
loading on the CPU; a packed copy never outlives a change of its weight, and training never
uses it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from specdec.core.errors import NonFiniteLogits
from specdec.runtime import projection
from specdec.runtime.projection import _ColumnLinear, column_linear, forward_logits, use_column_kernels


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
    assert use_column_kernels(plain) is plain and all(
        type(m) is _ColumnLinear for m in plain.modules() if isinstance(m, nn.Linear)
    )


def _linear(out_features: int, in_features: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return use_column_kernels(nn.Sequential(nn.Linear(in_features, out_features)))[0]


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9, 64, 65])
def test_the_packed_path_is_f_linear(rows):
    layer = _linear(96, 64, rows)
    x = torch.randn(1, rows, 64)  # rows in all: the switch counts them over every leading dimension
    with torch.no_grad():
        got = layer(x)
    packed = layer.__dict__.get("_packed")
    assert (packed is not None and packed[1] is not None) == (
        rows >= projection._PACKED_MIN_ROWS and torch.backends.mkldnn.is_available()
    )
    torch.testing.assert_close(got, nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4)


def test_loading_packs_every_linear_up_front(tiny):
    """A packed copy made at the first verify pass with 2+ drafts cost that pass a second (the
    output projection's), and the coordinator's cost model took it for the price of drafting."""
    linears = [m for m in tiny("gemma3", 1).model.modules() if isinstance(m, _ColumnLinear)]
    packed = [m.__dict__.get("_packed", (None, None))[1] is not None for m in linears]
    assert linears and all(p == torch.backends.mkldnn.is_available() for p in packed)


def test_a_changed_weight_is_packed_again_and_copies_pack_their_own():
    layer = _linear(32, 16, 0)
    x = torch.randn(4, 16)
    with torch.no_grad():
        layer(x)
        layer.weight.copy_(torch.randn(32, 16))  # what loading trained weights into a draft's layers does
        after = layer(x)
    torch.testing.assert_close(after, nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4)
    twin = copy.deepcopy(layer)
    assert "_packed" not in twin.__dict__
    with torch.no_grad():
        twin.weight.mul_(2)
        torch.testing.assert_close(twin(x), nn.functional.linear(x, twin.weight, twin.bias), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(layer(x), after)  # the original's packed copy is its own


def test_training_gets_gradients_and_never_packs():
    layer = _linear(8, 4, 1)
    x = torch.randn(5, 4, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad is not None and x.grad is not None
    assert "_packed" not in layer.__dict__


def test_the_packed_path_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(projection, "_PACKED_ENABLED", False)
    layer = _linear(8, 4, 2)
    with torch.no_grad():
        layer(torch.randn(5, 4))
    assert "_packed" not in layer.__dict__


def _sliced(out_features: int, in_features: int, monkeypatch) -> nn.Linear:
    """A packed layer whose outputs span several slices, the last one short."""
    monkeypatch.setattr(projection, "VOCAB_SLICE", 16)
    layer = _linear(out_features, in_features, out_features)
    nn.init.normal_(layer.bias)
    return layer


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the sliced product is oneDNN's")
@pytest.mark.parametrize("rows", [1, 5, 33])
@torch.no_grad()
def test_a_vocabulary_projection_is_made_and_reduced_slice_by_slice(rows, monkeypatch):
    layer = _sliced(100, 24, monkeypatch)
    x = torch.randn(rows, 24, generator=torch.Generator().manual_seed(rows))
    full = nn.functional.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(layer(x), full, rtol=1e-5, atol=1e-4)
    assert [start for start, _ in layer._packed_weight()] == [0, 16, 32, 48, 64, 80, 96]
    assert torch.equal(layer.argmax(x), full.argmax(-1))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the sliced product is oneDNN's")
@torch.no_grad()
def test_the_sliced_argmax_takes_the_lowest_of_tied_ids_and_names_rows_without_one(monkeypatch):
    layer = _sliced(100, 8, monkeypatch)
    layer.bias.zero_()
    layer.weight.mul_(0.01)
    for tied in (40, 3, 45):  # two slices and, within the later one, two positions
        layer.weight[tied] = 1.0
    x = torch.ones(2, 8)
    assert layer.argmax(x).tolist() == [3, 3]
    x[1, 2] = float("nan")
    with pytest.raises(NonFiniteLogits) as raised:
        layer.argmax(x)
    assert raised.value.rows == [1]
    x[1, 2], x[0, 0] = 1.0, float("inf")
    with pytest.raises(NonFiniteLogits) as raised:
        layer.argmax(x)
    assert raised.value.rows == [0]
