"""Every tensor of the verify hot path lives on the model's device, with one host sync a pass.

No GPU is needed: the model's weights are swapped for FakeTensors on a non-CPU device under
PyTorch's FakeTensorMode, which runs the real code on shapes alone and raises
`FakeTensorDeviceMismatchError` whenever an op mixes devices. The device is `meta` rather than
`cuda` because a CPU-only torch refuses `cuda` in its Python bindings (`.float()`, `.to()` and
indexing initialise CUDA even for fake tensors); the code under test never names a device, it
uses the weights' one, so any non-CPU device exercises the same paths. A control test builds one
hot-path tensor on the CPU and shows the check fails.
"""

from __future__ import annotations

import pytest
import torch
import torch._subclasses.fake_tensor as fake_tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorDeviceMismatchError, FakeTensorMode

from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.runtime import ragged
from specdec.runtime.loading import load_model
from specdec.target_service import verifier as verifier_module
from specdec.target_service.verifier import TargetVerifier, VerifyItem

DEVICE = torch.device("meta")


@pytest.fixture
def fake_mode(monkeypatch):
    # One-element tensors are tracked as real constants by default, and ops on a constant run
    # for real, on a device that does not exist here.
    monkeypatch.setattr(fake_tensor, "CONSTANT_NUMEL_LIMIT", 0)
    return FakeTensorMode(allow_non_fake_inputs=True)  # q arrives from the wire as a real CPU tensor


def _fake_model(tiny_dir, kind: str, mode: FakeTensorMode):
    """A private copy of a tiny model with every weight, buffer and tensor attribute (rotary
    frequencies) a FakeTensor on DEVICE."""
    loaded = load_model(tiny_dir(kind, 1))

    def fake(t: torch.Tensor) -> FakeTensor:
        return FakeTensor(mode, t.detach().to("meta"), DEVICE)

    for module in loaded.model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(fake(p), requires_grad=False)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake(b)
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                setattr(module, name, fake(value))
    return loaded


def _items() -> list[VerifyItem]:
    q = torch.softmax(torch.randn(3, 259, generator=torch.Generator().manual_seed(0)), -1)  # from the wire: CPU
    return [
        VerifyItem("greedy", list(range(3, 23)), DraftProposal([5, 6, 7]), SamplingParams()),
        VerifyItem("lookup", list(range(4, 9)), DraftProposal([5, 6]), SamplingParams(temperature=0.8, seed=1)),
        VerifyItem(
            "model", list(range(5, 40)), DraftProposal([5, 6, 7], q), SamplingParams(temperature=0.7, top_p=0.9, seed=3)
        ),
        VerifyItem("plain", [3], DraftProposal([]), SamplingParams(temperature=1.0, top_k=5, seed=2)),
    ]


@pytest.fixture
def syncs(monkeypatch):
    """Every device-to-host read of the verifier: the tensor's device and size. Fake tensors
    hold no values, so it answers zeros (every draft rejected, token 0)."""
    seen: list[tuple[torch.device, int]] = []

    def to_host(t: torch.Tensor) -> list[int]:
        seen.append((t.device, t.numel()))
        return [0] * t.numel()

    monkeypatch.setattr(verifier_module, "_to_host", to_host)
    return seen


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_a_batched_pass_stays_on_the_model_device(tiny_dir, fake_mode, syncs, kind):
    loaded = _fake_model(tiny_dir, kind, fake_mode)
    items = _items()
    with fake_mode:
        verifier = TargetVerifier(loaded, kv_cache_bytes=1 << 22, pass_tokens=32)
        assert verifier.pool.keys[0].device == DEVICE
        first = verifier.step(items)
        pending, passes = [item for item in items if item not in first], 1
        while pending:
            results = verifier.step(pending)
            pending, passes = [item for item in pending if item not in results], passes + 1
    assert [item in first for item in items] == [True, True, False, True]  # the 35-token prompt: a chunk
    # One host sync a pass that decides rounds, of the decisions only (greedy k+1, lookup k+1,
    # plain 1; then the model's 2k+1); a pass of prefill chunks alone reads nothing back.
    assert passes == 3 and syncs == [(DEVICE, 4 + 3 + 1), (DEVICE, 7)]


def test_a_hot_path_tensor_on_the_cpu_is_caught(tiny_dir, fake_mode, syncs, monkeypatch):
    """The control: the pass's slot indices built on the CPU make the same pass raise."""
    loaded = _fake_model(tiny_dir, "llama", fake_mode)
    monkeypatch.setattr(ragged, "_tensor", lambda values, device: torch.tensor(values, dtype=torch.int64))
    with fake_mode:
        verifier = TargetVerifier(loaded, kv_cache_bytes=1 << 22)
        with pytest.raises(FakeTensorDeviceMismatchError):
            verifier.step(_items()[:1])
