"""Suffix decoding through the engine: similar requests served one after another draft from the
earlier ones' completions, and every output stays exactly the target's: greedy equals
target-only greedy, and seeded sampling equals target-only sampling with that seed (suffix
drafts are point masses, judged by the request's own keyed draw)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from reference import target_only
from tiny import EOS_ID, TOKENIZER_SIZE

from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.core import tree
from specdec.core.sampling import SamplingParams
from specdec.draft_service.drafter import Drafted, DraftRequest
from specdec.draft_service.hybrid import HybridDrafter, parse_spec, uses_suffix
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.registry import HybridDrafting, SuffixDrafting
from specdec.draft_service.suffix import SuffixDrafter
from specdec.drafts.pruned_draft import build_pruned_draft
from specdec.local.in_process import LocalProposer, LocalVerifier
from specdec.target_service.verifier import TargetVerifier

# Similar requests: one template, a different "argument" each (the first token and one in the middle).
TEMPLATE = [11, 23, 35, 47, 59, 61, 73, 85, 97, 109]
REQUESTS = [[3 + i, *TEMPLATE[:5], 200 + i, *TEMPLATE[5:]] for i in range(6)]
NEW_TOKENS = 24
CONFIG = EngineConfig(max_draft_tokens=8, adaptive=False)
SAMPLED = SamplingParams(temperature=0.8, seed=11)


def _serve_in_order(engine: SpeculativeEngine, sampling: SamplingParams) -> list:
    async def run():
        return [
            await engine.generate(
                GenerationRequest(
                    prompt_token_ids=prompt, max_new_tokens=NEW_TOKENS, sampling=sampling, max_draft_tokens=8
                )
            )
            for prompt in REQUESTS
        ]

    return asyncio.run(run())


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_similar_requests_draft_from_earlier_completions_and_outputs_stay_the_targets(tiny, kind, sampling):
    target = tiny(kind, 1)
    suffix = SuffixDrafter()
    engine = SpeculativeEngine(
        LocalProposer(SuffixDrafting(suffix)), LocalVerifier(TargetVerifier(target)), target, CONFIG
    )
    results = _serve_in_order(engine, sampling)
    for prompt, result in zip(REQUESTS, results):
        expected = target_only(target.model, prompt, NEW_TOKENS, target.eos_token_ids, sampling)
        assert result.token_ids == expected
    assert suffix.stats.learned == len(REQUESTS)  # every request's completion went into the cache
    assert suffix.stats.from_cache > 0  # and later requests drafted from it
    later = results[len(REQUESTS) // 2 :]
    assert sum(r.stats.accepted_tokens for r in later) > 0


def test_a_suffix_hybrid_drafts_lookups_first_and_the_model_elsewhere(tiny):
    target = tiny("gemma3", 1)
    ids = sorted(set(range(0, TOKENIZER_SIZE, 2)) | {EOS_ID})
    draft = dataclasses.replace(target, model=build_pruned_draft(target.model, 1, ids), name="pruned")
    hybrid = HybridDrafter(ModelDrafter(draft), suffix=SuffixDrafter())
    engine = SpeculativeEngine(
        LocalProposer(HybridDrafting(hybrid)), LocalVerifier(TargetVerifier(target)), target, CONFIG
    )
    results = _serve_in_order(engine, SamplingParams())
    for prompt, result in zip(REQUESTS, results):
        assert result.token_ids == target_only(target.model, prompt, NEW_TOKENS, target.eos_token_ids)
    assert hybrid.suffix_rounds > 0 and hybrid.model_rounds > 0
    assert hybrid.ngram_rounds == 0 and hybrid.short_rounds == 0  # the suffix drafter is the lookup
    assert hybrid.suffix.stats.learned == len(REQUESTS)


def test_specs_name_the_suffix_drafters():
    assert uses_suffix("suffix") and uses_suffix("suffix:distilled") and not uses_suffix("hybrid:distilled")
    assert parse_spec("suffix:distilled") == "distilled" and parse_spec("suffix") is None


class _CountingTrees(SuffixDrafting):
    """The suffix drafter, counting the proposals that branch (trees that are not chains)."""

    branching = 0

    async def propose(self, request: DraftRequest) -> Drafted:
        drafted = await super().propose(request)
        parents = drafted.proposal.parents
        if parents is not None and not tree.is_chain(parents):
            self.branching += 1
        return drafted


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_token_trees_from_the_suffix_cache_keep_every_output_the_targets(tiny, sampling):
    """Similar requests whose completions differ make the suffix cache branch: with token trees
    on, the drafter proposes trees, the target verifies them in one pass, and every output is
    still target-only decoding's (seeded sampling included)."""
    target = tiny("gemma3", 1)
    drafter = _CountingTrees(SuffixDrafter())
    config = dataclasses.replace(CONFIG, token_tree=True)
    engine = SpeculativeEngine(LocalProposer(drafter), LocalVerifier(TargetVerifier(target)), target, config)
    results = _serve_in_order(engine, sampling)
    for prompt, result in zip(REQUESTS, results):
        assert result.token_ids == target_only(target.model, prompt, NEW_TOKENS, target.eos_token_ids, sampling)
    assert drafter.branching > 0
    assert sum(r.stats.accepted_tokens for r in results) > 0
