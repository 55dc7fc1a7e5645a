"""The distilled pruned-vocabulary draft: its vocabulary, its q, its losslessness, its training."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json

import pytest
import torch
from reference import target_only
from tiny import BOS_ID, EOS_ID, make_tiny_model

from specdec.coordinator.engine import EngineConfig, GenerationRequest
from specdec.core.sampling import SamplingParams, warp
from specdec.distill.data import load_corpus
from specdec.distill.train import DistillConfig, distill, main, train_step
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.drafts import draft_vocab
from specdec.drafts.loading import load_model, load_tokenizer
from specdec.drafts.pruned_draft import build_pruned_draft, save_pruned_draft, trainable_names, warp_pruned
from specdec.local.in_process import build_engine

PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]
FULL_VOCAB = 300  # the tiny tokenizer has 259 ids; real checkpoints pad their projection like this


@pytest.fixture(scope="module")
def target_spec(tmp_path_factory):
    return str(
        make_tiny_model("gemma3", tmp_path_factory.mktemp("t") / "target", seed=1, num_layers=4, vocab_size=FULL_VOCAB)
    )


@pytest.fixture(scope="module")
def target(target_spec):
    return load_model(target_spec)


@pytest.fixture(scope="module")
def expected(target):
    """The target's own greedy continuation of PROMPT."""
    return target_only(target.model, PROMPT, 24, target.eos_token_ids)


@pytest.fixture(scope="module")
def ids(expected):
    """128 of the 300 ids: the target's predictions first, as draft_vocab ranks them."""
    counts = draft_vocab.count_tokens(torch.tensor(expected), FULL_VOCAB)
    return draft_vocab.choose_vocab(
        counts, 128, {EOS_ID, BOS_ID}, draft_vocab.count_tokens(torch.arange(128), FULL_VOCAB)
    )


def test_choose_vocab_ranks_predictions_then_text_and_keeps_specials(tmp_path):
    predictions = torch.zeros(50, dtype=torch.long)
    predictions[[7, 3, 9]] = torch.tensor([5, 4, 1])
    text = torch.zeros(50, dtype=torch.long)
    text[[20, 21]] = torch.tensor([100, 50])
    ids = draft_vocab.choose_vocab(predictions, 6, always={49, 0}, text_counts=text)
    assert ids == [0, 3, 7, 9, 20, 49]  # specials, then predicted, then the most frequent text token
    assert draft_vocab.coverage(ids, predictions) == 1.0
    assert draft_vocab.coverage([3], predictions) == pytest.approx(0.4)
    logits = torch.zeros(2, 3, 50)
    logits[..., 7] = 1.0
    assert draft_vocab.count_predictions(logits)[7] == 6
    draft_vocab.save_vocab(tmp_path, ids)
    assert draft_vocab.load_vocab(tmp_path) == ids
    with pytest.raises(ValueError):
        draft_vocab.choose_vocab(predictions, 1, always={1, 2})


def test_pruned_draft_shares_the_embedding_and_stores_only_its_layers(target, target_spec, ids, tmp_path):
    draft = build_pruned_draft(target.model, 2, ids)
    assert target.model.config.num_hidden_layers == 4 and draft.config.num_hidden_layers == 2  # target untouched
    assert draft.get_input_embeddings().weight is target.model.get_input_embeddings().weight  # shared, never copied
    target_weights = dict(target.model.named_parameters())
    for name in trainable_names(draft):
        assert torch.equal(dict(draft.named_parameters())[name], target_weights[name]), name
    assert not any("embed" in n or "lm_head" in n for n in trainable_names(draft))

    with torch.no_grad():  # as after training: the draft's layers differ from the target's
        for name in trainable_names(draft):
            dict(draft.named_parameters())[name].mul_(1.01)
        logits = draft(input_ids=torch.tensor([PROMPT])).logits[0]  # (T, full vocab)
    outside = torch.ones(FULL_VOCAB, dtype=torch.bool)
    outside[ids] = False
    assert (
        logits.shape[-1] == FULL_VOCAB
        and torch.isinf(logits[:, outside]).all()
        and torch.isfinite(logits[:, ~outside]).all()
    )

    save_pruned_draft(draft, tmp_path / "d", target_spec, target.model, torch.float32)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["draft.json", "model.safetensors", "vocab.json"]
    loaded = load_model(str(tmp_path / "d"))
    assert loaded.vocab_size == FULL_VOCAB and loaded.eos_token_ids == target.eos_token_ids
    with torch.no_grad():
        again = loaded.model(input_ids=torch.tensor([PROMPT])).logits[0]
    assert torch.allclose(again[:, ~outside], logits[:, ~outside], atol=1e-5) and torch.isinf(again[:, outside]).all()
    assert load_tokenizer(str(tmp_path / "d")).encode("hi") == target.tokenizer.encode("hi")


def test_sampled_q_is_a_distribution_over_the_full_vocabulary_zero_outside(target, ids):
    draft = dataclasses.replace(target, model=build_pruned_draft(target.model, 2, ids))
    sampling = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=3)
    proposal = ModelDrafter(draft).propose("s", PROMPT, 5, sampling)
    q = proposal.draft_probs  # (k, full vocab)
    assert q.shape == (5, FULL_VOCAB)
    assert torch.allclose(q.sum(-1), torch.ones(5), atol=1e-6)
    outside = torch.ones(FULL_VOCAB, dtype=torch.bool)
    outside[ids] = False
    assert (q[:, outside] == 0).all() and all(t in ids for t in proposal.token_ids)
    logits = torch.randn(3, FULL_VOCAB).masked_fill(outside, float("-inf"))
    vocab_ids = torch.tensor(ids)
    assert torch.allclose(warp_pruned(logits, sampling, vocab_ids), warp(logits, sampling), atol=1e-6)


@pytest.mark.parametrize("sampled", [False, True])
def test_pruned_draft_through_the_engine_changes_no_greedy_token(target, ids, expected, sampled):
    draft = dataclasses.replace(target, model=build_pruned_draft(target.model, 2, ids))
    engine = build_engine(target, draft, EngineConfig(max_draft_tokens=8, adaptive=False))
    sampling = SamplingParams(temperature=1.0, seed=11) if sampled else SamplingParams()
    runs = [
        asyncio.run(
            engine.generate(
                GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=24, max_draft_tokens=k, sampling=sampling)
            )
        )
        for k in (1, 4)
    ]
    if sampled:  # seeded: the same text again, every token a valid id
        again = asyncio.run(
            engine.generate(
                GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=24, max_draft_tokens=4, sampling=sampling)
            )
        )
        assert again.token_ids == runs[1].token_ids and all(0 <= t < FULL_VOCAB for t in again.token_ids)
    else:
        assert all(run.token_ids == expected for run in runs)
        assert sum(run.stats.accepted_tokens for run in runs) > 0  # the draft really drafted, and agreed at times
    assert all(run.stats.draft_tokens > 0 for run in runs)


def test_train_steps_reduce_the_kl_on_a_fixed_batch(target, ids):
    draft = build_pruned_draft(target.model, 1, ids)
    params = dict(draft.named_parameters())
    trained = [params[n].requires_grad_(True) for n in trainable_names(draft)]
    optimizer = torch.optim.AdamW(trained, lr=3e-3)
    batch = torch.randint(0, 259, (2, 24))
    losses = [train_step(draft, target, batch, optimizer) for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert target.model.get_input_embeddings().weight.grad is None  # the shared embedding never trains


def test_corpus_reads_gzip_skips_binary_and_holds_out_whole_files(target, tmp_path):
    (tmp_path / "a.txt").write_text("plain text about cats. " * 40)
    (tmp_path / "b.1.gz").write_bytes(gzip.compress(b".TH B 1\nman page about dogs. " * 40))
    (tmp_path / "c.txt").write_bytes(b"\0binary" * 50)
    corpus = load_corpus(target.tokenizer, [tmp_path], seq_len=16, max_mb=1.0)
    assert corpus.files == 2 and len(corpus.train) and len(corpus.heldout)
    assert (corpus.train[:, 0] == BOS_ID).all() and corpus.train.shape[1] == 16
    assert 0 not in corpus.train[:, 1:]  # no NUL byte from the binary file


def test_distill_writes_a_servable_draft_and_resumes_where_it_stopped(target_spec, tmp_path):
    (tmp_path / "text").mkdir()
    for i in range(4):
        (tmp_path / "text" / f"doc{i}.txt").write_text(
            f"document {i}: the quick brown fox jumps over the lazy dog. " * 30
        )
    out = tmp_path / "draft"
    args = ["--target-model", target_spec, "--out", str(out), "--layers", "1", "--vocab-size", "96",
            "--seq-len", "32", "--batch", "2", "--eval-every", "2", "--checkpoint-every", "2",
            "--corpus", str(tmp_path / "text"), "--vocab-sample-tokens", "64", "--save-dtype", "float32"]  # fmt: skip
    assert main(args + ["--steps", "4"]) == 0
    first = json.loads((out / "log.json").read_text())["log"]
    assert [e["step"] for e in first] == [0, 1, 2, 3, 4] and "heldout_acceptance" in first[0]
    assert main(args + ["--steps", "6"]) == 0
    log = json.loads((out / "log.json").read_text())["log"]
    assert [e["step"] for e in log] == [0, 1, 2, 3, 4, 5, 6]  # resumed at 4, no step done twice
    assert log[:5] == first
    assert torch.load(out / "checkpoint" / "state.pt")["step"] == 6
    draft = load_model(str(out))
    assert draft.model.config.num_hidden_layers == 1 and len(draft_vocab.load_vocab(out)) == 96
    assert draft.min_confidence == DistillConfig(None, out).min_confidence > 0  # draft.json's greedy stop threshold
    assert (out / "progress.png").is_file() or pytest.importorskip("matplotlib") is None
    with pytest.raises(ValueError, match="vocab_size"):  # a checkpoint resumes only the run that made it
        main([a if a != "96" else "64" for a in args] + ["--steps", "8"])


def test_time_budget_stops_training_and_saves(target, target_spec, tmp_path):
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "t.txt").write_text("some text to learn from. " * 80)
    (tmp_path / "text" / "u.txt").write_text("other text held out. " * 80)
    config = DistillConfig(target_spec, tmp_path / "out", layers=1, vocab_size=64, steps=1000, seq_len=16, batch=2,
                           vocab_sample_tokens=32, sources=[tmp_path / "text"], time_budget_min=1e-9)  # fmt: skip
    final = distill(config, target)
    assert final["step"] <= 1 and (tmp_path / "out" / "model.safetensors").is_file()


def test_generated_rows_are_the_targets_greedy_continuations_and_train_the_draft(target, target_spec, tmp_path):
    """--generated-rows: rows of a corpus opening + the target's greedy continuation, resumable,
    mixed into training, their held-out share measured; --init-from starts from another run."""
    (tmp_path / "text").mkdir()
    for i in range(4):
        (tmp_path / "text" / f"doc{i}.txt").write_text(
            f"document {i}: the quick brown fox jumps over the lazy dog. " * 30
        )
    base = DistillConfig(target_spec, tmp_path / "first", layers=1, vocab_size=96, steps=2, seq_len=24, batch=4,
                         vocab_sample_tokens=64, sources=[tmp_path / "text"], save_dtype="float32",
                         generated_rows=6, prompt_tokens=8, generate_batch=4)  # fmt: skip
    final = distill(base, target)
    generated = torch.load(tmp_path / "first" / "checkpoint" / "generated.pt")
    assert generated.shape == (6, 24)
    for row in generated[:2]:  # each row continues its opening exactly as the target alone would
        assert row[8:].tolist() == target_only(target.model, row[:8].tolist(), 16, set())
    assert 0.0 <= final["heldout_generated_acceptance"] <= 1.0

    # Starting a second run from the first: same vocabulary, the first's weights before any step.
    second = dataclasses.replace(base, out=tmp_path / "second", steps=0, init_from=tmp_path / "first")
    distill(second, target)
    assert draft_vocab.load_vocab(tmp_path / "second") == draft_vocab.load_vocab(tmp_path / "first")
    a = load_model(str(tmp_path / "first")).model.state_dict()
    b = load_model(str(tmp_path / "second")).model.state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
