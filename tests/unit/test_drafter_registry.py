"""The registry maps a configuration to one drafter, and the lookups honour the Drafter contract."""

import asyncio

from specdec.core.sampling import SamplingParams
from specdec.draft_service.drafter import DraftRequest
from specdec.draft_service.registry import NgramDrafting, SuffixDrafting, build_drafter, draft_model
from specdec.draft_service.suffix import SuffixConfig

REPEATS = [5, 17, 42, 8, 5, 17, 42, 8, 5, 17]


def test_specs_name_the_model_they_load():
    assert draft_model(None) is None and draft_model("ngram") is None and draft_model("suffix") is None
    assert draft_model("some/dir") == "some/dir"
    assert draft_model("hybrid:some/dir") == "some/dir" and draft_model("suffix:some/dir") == "some/dir"


def test_without_a_model_the_registry_builds_a_lookup():
    ngram = build_drafter(None)
    suffix = build_drafter(None, suffix=SuffixConfig())
    assert type(ngram) is NgramDrafting and not ngram.capabilities.learns and not ngram.capabilities.trees
    assert type(suffix) is SuffixDrafting and suffix.capabilities.learns and suffix.capabilities.trees
    assert not ngram.capabilities.model and not suffix.capabilities.draft_probs


def test_lookups_answer_through_the_contract():
    request = DraftRequest("s", REPEATS, 3, SamplingParams())
    ngram = asyncio.run(NgramDrafting().propose(request))
    assert (ngram.proposal.token_ids, ngram.proposal.source, ngram.found_in) == ([42, 8, 5], "ngram", "")
    suffix = SuffixDrafting()
    assert suffix.observe("s", [1, 2, 3, 4]).tokens > 0  # learned: the cache now holds the completion
    chain = asyncio.run(suffix.propose(request))
    assert chain.proposal.source == "suffix" and chain.proposal.parents is None and chain.found_in == "context"
    tree = asyncio.run(suffix.propose(DraftRequest("s", REPEATS, 3, SamplingParams(), tree=True)))
    assert tree.proposal.parents is not None and tree.proposal.parents[0] == -1
    suffix.end("s")  # nothing per session to forget; unknown ids are fine
