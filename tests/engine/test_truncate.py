"""A draft cut from its target keeps the target's first layers, embedding and final norm exactly,
and drafts through the ordinary loader and engine without changing the output."""

from __future__ import annotations

import asyncio

import pytest
import torch
from reference import target_only

from specdec.coordinator.engine import EngineConfig, GenerationRequest
from specdec.drafts.truncate import first_layers_dir
from specdec.local.in_process import build_engine
from specdec.runtime.loading import load_model

PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_first_layers_are_the_targets_and_greedy_is_unchanged(tiny_dir, tmp_path, monkeypatch, kind):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    spec = str(tiny_dir(kind, 1))
    target = load_model(spec)
    out = first_layers_dir(spec, 1)
    assert first_layers_dir(spec, 1) == out  # cached: built once
    draft = load_model(str(out))
    assert draft.model.config.num_hidden_layers == 1 < target.model.config.num_hidden_layers
    target_weights = target.model.state_dict()
    for name, weight in draft.model.state_dict().items():
        assert torch.equal(weight, target_weights[name]), name  # every kept weight is the target's
    assert not any(".layers.1." in name for name in draft.model.state_dict())

    engine = build_engine(target, draft, EngineConfig(max_draft_tokens=8, adaptive=False))
    result = asyncio.run(
        engine.generate(GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=24, max_draft_tokens=4))
    )
    assert result.stats.draft_tokens > 0
    assert result.token_ids == target_only(target.model, PROMPT, 24, target.eos_token_ids)


def test_more_layers_than_the_target_is_an_error(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="num_layers"):
        first_layers_dir(str(tiny_dir("llama", 1)), 3)
    assert not any((tmp_path / "drafts").iterdir())  # a failed build leaves no directory behind
