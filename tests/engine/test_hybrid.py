"""The hybrid drafter: prompt lookup where the context repeats, the (pruned) model elsewhere, and
the output unchanged either way."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from prometheus_client import REGISTRY
from reference import target_only
from tiny import EOS_ID, TOKENIZER_SIZE

from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.core.sampling import SamplingParams
from specdec.draft_service.drafter import DraftRequest
from specdec.draft_service.hybrid import HybridConfig, HybridDrafter, parse_spec
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.registry import HybridDrafting, ModelDrafting
from specdec.draft_service.server import ServerConfig, load_core
from specdec.draft_service.service import DraftCore, ProposeCall
from specdec.drafts.pruned_draft import build_pruned_draft
from specdec.local.in_process import LocalProposer, LocalVerifier
from specdec.target_service.verifier import TargetVerifier

# Ends on 5 17 42, which occurred twice before: the first round is a lookup.
PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17, 42]
REPEATS = [1, 2, 3, 4, 9, 1, 2, 3]  # suffix 1 2 3 seen before, followed by 4 9 ...
NO_REPEAT = [1, 2, 3, 4, 9, 7, 2, 3]  # suffix 2 3 seen before, but 7 2 3 never: shorter than min_match
NO_MATCH = [1, 2, 3, 4, 9, 7, 2, 6]  # the last token never occurred before: only the model drafts
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, seed=5)


@pytest.fixture(scope="module")
def target(tiny):
    return tiny("gemma3", 1)


@pytest.fixture(scope="module")
def draft(target):
    """A 1-layer pruned draft of the 2-layer target over every other token id (and EOS)."""
    ids = sorted(set(range(0, TOKENIZER_SIZE, 2)) | {EOS_ID})
    return dataclasses.replace(target, model=build_pruned_draft(target.model, 1, ids), name="pruned")


def test_a_long_match_then_a_short_one_then_the_model(draft):
    hybrid = HybridDrafter(ModelDrafter(draft), HybridConfig(min_match=3))
    long, short = hybrid.choose(REPEATS, 4), hybrid.choose(NO_REPEAT, 4)
    assert (long.token_ids, long.source) == ([4, 9, 1, 2], "ngram")
    assert (short.token_ids, short.source) == ([4, 9, 7, 2], "ngram_short")  # 2 3 -> 4 9 7 2
    assert hybrid.choose(NO_MATCH, 4) is None  # the model's round
    assert (hybrid.ngram_rounds, hybrid.short_rounds, hybrid.model_rounds) == (1, 1, 1)
    only_long = HybridDrafter(ModelDrafter(draft), HybridConfig(min_match=1, max_match=3))
    assert only_long.choose(NO_REPEAT, 2).source == "ngram" and only_long.short is None
    with pytest.raises(ValueError):
        HybridDrafter(ModelDrafter(draft), HybridConfig(min_match=4, max_match=3))
    assert parse_spec("hybrid:some/dir") == "some/dir" and parse_spec("some/dir") is None


def test_a_model_that_declines_leaves_the_round_without_a_draft(draft):
    """Greedy drafts stop at the model's first unsure token; with no match to fall back on the
    round verifies no draft (the target's pass still yields a token)."""
    unsure = HybridDrafter(ModelDrafter(draft, min_confidence=0.999))
    declined = unsure.propose("a", NO_MATCH, 2, GREEDY)
    assert (declined.token_ids, declined.source) == ([], "model")
    sure = HybridDrafter(ModelDrafter(draft))  # no threshold: the model answers
    assert (
        sure.propose("a", NO_MATCH, 2, GREEDY).token_ids
        == ModelDrafter(draft).propose("b", NO_MATCH, 2, GREEDY).token_ids
    )
    assert sure.model_rounds == 1 and sure.short_rounds == 0


def test_each_round_is_a_lookup_or_a_model_draft(draft):
    hybrid = HybridDrafter(ModelDrafter(draft))
    items = [
        DraftRequest("a", REPEATS, 3, SAMPLED),
        DraftRequest("b", NO_MATCH, 3, SAMPLED),
        DraftRequest("c", NO_REPEAT, 3, SAMPLED),
    ]
    looked_up, modelled, short = hybrid.propose_batch(items)
    assert looked_up.token_ids == [4, 9, 1] and looked_up.draft_probs is None  # a point mass: no q
    assert len(modelled.token_ids) == 3 and modelled.draft_probs.shape == (3, draft.vocab_size)
    assert short.source == "ngram_short" and short.draft_probs is None
    assert (hybrid.ngram_rounds, hybrid.short_rounds, hybrid.model_rounds) == (1, 1, 1)
    assert hybrid.model.sessions.keys() == {"b"}  # lookups never touch the model


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_hybrid_through_the_engine(target, draft, sampling):
    hybrid = HybridDrafter(ModelDrafter(draft))
    config = EngineConfig(max_draft_tokens=8, adaptive=False)
    engine = SpeculativeEngine(
        LocalProposer(HybridDrafting(hybrid)), LocalVerifier(TargetVerifier(target)), target, config
    )
    runs = [
        asyncio.run(
            engine.generate(
                GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=24, max_draft_tokens=k, sampling=sampling)
            )
        )
        for k in (1, 3, 8)
    ]
    assert hybrid.ngram_rounds > 0 and hybrid.model_rounds > 0  # both kinds of round happened
    if sampling.greedy:
        expected = target_only(target.model, PROMPT, 24, target.eos_token_ids)
        assert all(run.token_ids == expected for run in runs)
    else:  # each round is judged on its own: seeded output is reproducible and every token valid
        again = asyncio.run(
            engine.generate(
                GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=24, max_draft_tokens=8, sampling=sampling)
            )
        )
        assert again.token_ids == runs[-1].token_ids and all(0 <= t < target.vocab_size for t in again.token_ids)


def _rounds(source: str) -> float:
    return REGISTRY.get_sample_value("specdec:draft_rounds_total", {"source": source}) or 0.0


def test_draft_core_answers_lookups_inline_and_queues_the_rest(draft):
    core = DraftCore(draft, hybrid=HybridConfig())
    before = _rounds("ngram"), _rounds("ngram_short"), _rounds("model")

    async def run():
        try:
            first = await core.propose(ProposeCall("a", 0, REPEATS, 3, SAMPLED))
            short = await core.propose(ProposeCall("b", 0, NO_REPEAT, 3, SAMPLED))
            batches_after_lookups = core.stats.batches
            third = await core.propose(ProposeCall("c", 0, NO_MATCH, 3, SAMPLED))
            return first, short, batches_after_lookups, third
        finally:
            await core.close()

    first, short, batches_after_lookups, third = asyncio.run(run())
    assert first.proposal.token_ids == [4, 9, 1] and first.proposal.draft_probs is None
    assert short.proposal.token_ids == [4, 9, 7] and short.proposal.source == "ngram_short"
    assert batches_after_lookups == 0
    assert third.proposal.draft_probs is not None and core.stats.batches == 1
    # Counted where operators see it (Prometheus) and on the drafter, one round of each kind.
    assert tuple(_rounds(s) - b for s, b in zip(("ngram", "ngram_short", "model"), before)) == (1, 1, 1)
    hybrid = core.drafter.hybrid
    assert (hybrid.ngram_rounds, hybrid.short_rounds, hybrid.model_rounds) == (1, 1, 1)


def test_a_model_capped_at_zero_is_never_run_and_lookups_keep_their_k(draft):
    """model_draft_tokens prices the model apart: 0 skips it, a cap shortens its drafts, and
    lookups (long or short) keep the call's k. The source travels with each answer."""
    core = DraftCore(draft, hybrid=HybridConfig())

    async def run():
        try:
            lookup = await core.propose(ProposeCall("a", 0, REPEATS, 4, GREEDY, model_k=0))
            short = await core.propose(ProposeCall("b", 0, NO_REPEAT, 2, GREEDY, model_k=0))
            skipped = await core.propose(ProposeCall("c", 0, NO_MATCH, 4, GREEDY, model_k=0))
            batches_with_model_off = core.stats.batches
            capped = await core.propose(ProposeCall("d", 0, NO_MATCH, 4, GREEDY, model_k=2))
            return lookup, short, skipped, batches_with_model_off, capped
        finally:
            await core.close()

    lookup, short, skipped, batches_with_model_off, capped = asyncio.run(run())
    assert (lookup.proposal.token_ids, lookup.proposal.source) == ([4, 9, 1, 2], "ngram")
    assert (short.proposal.token_ids, short.proposal.source) == ([4, 9], "ngram_short")
    assert (skipped.proposal.token_ids, skipped.proposal.source) == ([], "model")
    assert batches_with_model_off == 0  # the model never ran while capped at 0
    assert len(capped.proposal.token_ids) == 2 and capped.proposal.source == "model" and core.stats.batches == 1
    in_process = HybridDrafter(ModelDrafter(draft))
    assert in_process.propose("e", NO_MATCH, 4, GREEDY, model_k=0).token_ids == []
    assert "e" not in in_process.model.sessions


def test_the_server_reads_hybrid_specs(tiny_dir):
    spec = tiny_dir("gemma3", 2)
    assert type(load_core(ServerConfig(draft_model=f"hybrid:{spec}")).drafter) is HybridDrafting
    assert type(load_core(ServerConfig(draft_model=spec)).drafter) is ModelDrafting


def test_the_in_process_engine_builds_a_hybrid(target, draft):
    from specdec.local.in_process import build_engine

    # A fixed k: the first round drafts, where the prompt's own repeat (5 17 42) is the lookup's.
    engine = build_engine(target, draft, EngineConfig(max_draft_tokens=4, adaptive=False), hybrid=True)
    assert type(engine.proposer.drafter) is HybridDrafting
    result = asyncio.run(
        engine.generate(GenerationRequest(prompt_token_ids=PROMPT, max_new_tokens=16, max_draft_tokens=4))
    )
    assert result.token_ids == target_only(target.model, PROMPT, 16, target.eos_token_ids)
    assert engine.proposer.drafter.hybrid.ngram_rounds > 0
