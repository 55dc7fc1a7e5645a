"""The distilled draft shipped for the embedded target: how specs name it, what `auto` means (the
suffix drafter, for every target), and (slow) the real draft through `specdec generate`, lossless."""

from __future__ import annotations

import json

import pytest
import torch
from google.protobuf import json_format
from reference import target_only
from tiny import EOS_ID, TOKENIZER_SIZE

from specdec.cli.app import main
from specdec.drafts import draft_vocab, shipped_draft
from specdec.drafts.loading import load_model, load_tokenizer
from specdec.drafts.pruned_draft import build_pruned_draft, save_pruned_draft
from specdec.v1 import generation_pb2 as pb


@pytest.fixture
def shipped(tiny, tiny_dir, tmp_path, monkeypatch):
    """A tiny pruned draft standing in as the shipped one."""
    spec = tiny_dir("gemma3", 2)
    target = tiny("gemma3", 2)
    ids = sorted(set(range(0, TOKENIZER_SIZE, 2)) | {EOS_ID})
    save_pruned_draft(build_pruned_draft(target.model, 1, ids), tmp_path / "drafts", spec, target.model)
    monkeypatch.setattr(shipped_draft, "DIRECTORY", tmp_path / "drafts")
    return tmp_path / "drafts"


def test_auto_is_the_suffix_drafter_for_every_target_and_named_drafters_are_kept():
    assert shipped_draft.available()  # the repository still ships the draft, by name
    for target in (None, "default", "some/other-model"):
        assert shipped_draft.resolve_drafter("auto", target) == shipped_draft.resolve_drafter(None, target) == "suffix"
    for named in ("ngram", "distilled", "hybrid:distilled", "suffix:distilled", "some/dir"):
        assert shipped_draft.resolve_drafter(named, None) == named  # what the user names is kept


def test_distilled_names_the_shipped_directory_wherever_a_model_is_named(shipped):
    draft = load_model("distilled")
    assert draft.name == str(shipped) and draft.model.config.num_hidden_layers == 1
    assert draft_vocab.load_vocab(shipped) == draft.model.get_output_embeddings().vocab_ids.tolist()
    assert load_tokenizer("distilled").vocab_size == load_tokenizer(shipped_draft.resolve_model("distilled")).vocab_size


def test_the_repository_ships_the_draft():
    """The draft is in the repository, small, and made for the embedded target."""
    assert shipped_draft.available()
    files = {p.name: p.stat().st_size for p in shipped_draft.DIRECTORY.iterdir()}
    assert set(files) >= {"draft.json", "vocab.json", "model.safetensors"}
    assert sum(files.values()) < 40e6  # only the layers it trained: the embedding and head rows are the target's
    from specdec.drafts.pruned_draft import target_spec

    assert target_spec(shipped_draft.DIRECTORY) is None  # None: the embedded default, wherever it is installed
    meta = json.loads((shipped_draft.DIRECTORY / "draft.json").read_text())
    assert meta["num_layers"] == 2 and meta["draft_vocab"] == 32768 and 0 < meta["min_confidence"] < 1


@pytest.mark.slow
def test_specdec_generate_with_the_shipped_draft_changes_no_token(capsys):
    """The real thing: `specdec generate --in-process --draft-model hybrid:distilled` on the
    embedded target: its greedy output is the target's own, token for token."""
    prompt = "The old lighthouse keeper climbed the stairs one last time. At the top, he"
    assert (
        main(
            [
                "generate",
                "--in-process",
                "--draft-model",
                "hybrid:distilled",
                "--max-new-tokens",
                "24",
                "--json",
                prompt,
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    response = json_format.Parse(captured.out, pb.GenerateResponse(), ignore_unknown_fields=True)
    assert "draft hybrid:distilled" in captured.err
    assert json.loads(captured.out)["targetDecoder"] == "fused"  # the embedded Gemma 3's
    target = load_model(None)
    ids = target.tokenizer(prompt)["input_ids"]
    expected = target_only(target.model, ids, 24, target.eos_token_ids)
    assert list(response.token_ids) == expected
    assert response.speculation.draft_tokens > 0  # it did speculate

    # q of the real draft: a distribution over the full vocabulary, zero outside its own.
    draft = load_model("distilled")
    head = draft.model.get_output_embeddings()
    with torch.no_grad():
        logits = draft.model(input_ids=torch.tensor([ids])).logits[0, -1]  # (full vocab,)
    probs = torch.softmax(logits.float(), -1)
    outside = torch.ones_like(probs, dtype=torch.bool)
    outside[head.vocab_ids] = False
    assert (
        logits.shape[-1] == target.vocab_size
        and abs(float(probs.sum()) - 1) < 1e-4
        and float(probs[outside].sum()) == 0.0
    )
