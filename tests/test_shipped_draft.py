"""The distilled draft shipped for the embedded target: how specs name it and the default drafter
it makes."""

from __future__ import annotations

import pytest

from specdec import draft_vocab, shipped_draft
from specdec.models import load_model, load_tokenizer
from specdec.pruned_draft import build_pruned_draft, save_pruned_draft
from specdec.tiny import EOS_ID, TOKENIZER_SIZE


@pytest.fixture
def shipped(tiny, tiny_dir, tmp_path, monkeypatch):
    """A tiny pruned draft standing in as the shipped one."""
    spec = tiny_dir("gemma3", 2)
    target = tiny("gemma3", 2)
    ids = sorted(set(range(0, TOKENIZER_SIZE, 2)) | {EOS_ID})
    save_pruned_draft(build_pruned_draft(target.model, 1, ids), tmp_path / "drafts", spec, target.model)
    monkeypatch.setattr(shipped_draft, "DIRECTORY", tmp_path / "drafts")
    return tmp_path / "drafts"


def test_auto_is_the_hybrid_distilled_draft_for_the_embedded_target_only(shipped, monkeypatch):
    assert shipped_draft.available()
    for embedded in (None, "default"):
        assert shipped_draft.resolve_drafter("auto", embedded) == "hybrid:distilled"
        assert shipped_draft.resolve_drafter(None, embedded) == "hybrid:distilled"
    assert shipped_draft.resolve_drafter("auto", "some/other-model") == "ngram"  # another tokenizer: no shipped draft
    for named in ("ngram", "distilled", "hybrid:distilled", "some/dir"):
        assert shipped_draft.resolve_drafter(named, None) == named  # what the user names is kept
    monkeypatch.setattr(shipped_draft, "DIRECTORY", shipped / "absent")
    assert not shipped_draft.available() and shipped_draft.resolve_drafter("auto", None) == "ngram"


def test_distilled_names_the_shipped_directory_wherever_a_model_is_named(shipped):
    draft = load_model("distilled")
    assert draft.name == str(shipped) and draft.model.config.num_hidden_layers == 1
    assert draft_vocab.load_vocab(shipped) == draft.model.get_output_embeddings().vocab_ids.tolist()
    assert load_tokenizer("distilled").vocab_size == load_tokenizer(shipped_draft.resolve_model("distilled")).vocab_size
