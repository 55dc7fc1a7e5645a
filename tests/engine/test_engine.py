"""Speculation never changes the output: greedy equals target-only greedy token for token,
and seeded sampling with point-mass drafts equals target-only seeded sampling."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
from reference import target_only
from tiny import (
    KINDS as TINY_KINDS,
)  # not `from conftest`: tests/reliability/ has a conftest of its own

from specdec.coordinator.engine import EngineConfig, FinishReason, GenerationRequest, SpeculativeEngine
from specdec.core.errors import InvalidArgument
from specdec.core.sampling import SamplingParams
from specdec.draft_service.drafter import Drafted, DraftRequest
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.registry import ModelDrafting, NgramDrafting
from specdec.local.in_process import LocalProposer, LocalVerifier
from specdec.target_service.verifier import TargetVerifier

# Repeats give the n-gram drafter something to match; random ids elsewhere keep it honest.
PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]
NEW_TOKENS = 24
DRAFTERS = ("ngram", "model", "self")  # self: the target drafts for itself, so every draft is accepted
# Seeds whose random tiny models neither stall on one token nor never repeat (checked by hand).
TARGET_SEED, DRAFT_SEED = 1, 2


def _engine(tiny, kind: str, drafter: str, target=None) -> SpeculativeEngine:
    target = target or tiny(kind, TARGET_SEED)
    if drafter == "ngram":
        proposer = LocalProposer(NgramDrafting())
    else:
        proposer = LocalProposer(ModelDrafting(ModelDrafter(target if drafter == "self" else tiny(kind, DRAFT_SEED))))
    return SpeculativeEngine(
        proposer, LocalVerifier(TargetVerifier(target)), target, EngineConfig(max_draft_tokens=8, adaptive=False)
    )


def _generate(engine: SpeculativeEngine, **fields):
    return asyncio.run(engine.generate(GenerationRequest(**fields)))


@pytest.fixture(scope="module")
def references(tiny):
    cache = {}

    def get(kind: str, eos=None):
        key = (kind, eos)
        if key not in cache:
            target = tiny(kind, TARGET_SEED)
            cache[key] = target_only(target.model, PROMPT, NEW_TOKENS, eos if eos is not None else target.eos_token_ids)
        return cache[key]

    return get


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("kind", TINY_KINDS)
def test_greedy_equals_target_only_for_every_k(tiny, references, kind, drafter):
    expected = references(kind)
    engine = _engine(tiny, kind, drafter)
    accepted = 0
    for k in range(1, 9):
        result = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, max_draft_tokens=k)
        assert result.token_ids == expected, f"k={k}"
        assert len(result.token_ids) <= result.stats.accepted_tokens + result.stats.rounds  # k+1 at most per round
        accepted += result.stats.accepted_tokens
    if drafter == "self":
        assert accepted > 0 and result.stats.acceptance_rate == 1.0  # drafting really happened


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_max_new_tokens_ending_inside_a_round(tiny, references, kind):
    expected = references(kind)
    engine = _engine(tiny, kind, "self")
    for max_new in (1, 2, 3, 6, 7, 11):
        result = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=max_new, max_draft_tokens=4)
        assert result.token_ids == expected[:max_new]
        assert result.finish_reason is FinishReason.LENGTH
        assert result.stats.draft_tokens <= max_new  # never drafts past what may be emitted


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_eos_inside_an_accepted_draft(tiny, references, kind):
    target = tiny(kind, TARGET_SEED)
    full = references(kind, eos=frozenset())
    # Make the token at output index 5 (the first draft of the second round when k = 4) the EOS.
    position = next(i for i in range(5, len(full)) if full[i] not in full[:i])
    eos = frozenset({full[position]})
    stopped_target = dataclasses.replace(target, eos_token_ids=eos)
    engine = _engine(tiny, kind, "self", target=stopped_target)
    result = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, max_draft_tokens=4)
    assert result.token_ids == full[: position + 1]
    assert result.finish_reason is FinishReason.STOP


def test_ignore_eos_generates_through_an_eos_to_max_new_tokens(tiny, references):
    """vLLM's `ignore_eos`: the same tokens as with no EOS at all, the EOS among them."""
    target = tiny("llama", TARGET_SEED)
    full = references("llama", eos=frozenset())
    position = next(i for i in range(3, len(full)) if full[i] not in full[:i])
    engine = _engine(tiny, "llama", "ngram", target=dataclasses.replace(target, eos_token_ids={full[position]}))
    stopped = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS)
    assert stopped.token_ids == full[: position + 1] and stopped.finish_reason is FinishReason.STOP
    ignored = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    assert ignored.token_ids == full and ignored.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_seeded_sampling_with_ngram_equals_target_only_sampling(tiny, kind):
    target = tiny(kind, TARGET_SEED)
    sampling = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=1234)
    expected = target_only(target.model, PROMPT, NEW_TOKENS, target.eos_token_ids, sampling)
    engine = _engine(tiny, kind, "ngram")
    for k in (1, 3, 8):
        result = _generate(
            engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, sampling=sampling, max_draft_tokens=k
        )
        assert result.token_ids == expected, f"k={k}"
    plain = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, sampling=sampling, speculate=False)
    assert plain.token_ids == expected and plain.stats.draft_tokens == 0


def test_seeded_sampling_with_model_drafter_is_reproducible(tiny):
    engine = _engine(tiny, "llama", "model")
    sampling = SamplingParams(temperature=1.0, seed=7)
    first = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, sampling=sampling, max_draft_tokens=4)
    again = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, sampling=sampling, max_draft_tokens=4)
    assert first.token_ids == again.token_ids and len(first.token_ids) > 0
    assert first.stats.draft_tokens > 0


def test_text_prompt_and_stop_string(tiny):
    engine = _engine(tiny, "llama", "self")
    full = _generate(engine, prompt="hello world", max_new_tokens=NEW_TOKENS)
    assert full.text and full.prompt_tokens > 0
    stop = full.text[3:5]  # a stop string that the greedy output is known to contain
    result = _generate(engine, prompt="hello world", max_new_tokens=NEW_TOKENS, stop=[stop])
    assert result.finish_reason is FinishReason.STOP
    assert result.text == full.text[: full.text.index(stop)]
    assert stop not in result.text
    assert result.token_ids == full.token_ids[: len(result.token_ids)]


def test_stream_concatenates_to_generate(tiny):
    engine = _engine(tiny, "gemma3", "ngram")

    async def collect():
        return [d async for d in engine.stream(GenerationRequest(prompt="héllo wörld ✓", max_new_tokens=NEW_TOKENS))]

    deltas = asyncio.run(collect())
    whole = _generate(engine, prompt="héllo wörld ✓", max_new_tokens=NEW_TOKENS)
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert "".join(d.text for d in deltas) == whole.text
    assert deltas[-1].finish_reason is not None and all(d.finish_reason is None for d in deltas[:-1])


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt_token_ids": []}, "prompt"),
        ({"prompt": "hi", "prompt_token_ids": [1]}, "prompt"),
        ({"prompt_token_ids": [10**6]}, "prompt_token_ids"),
        ({"prompt_token_ids": [-1]}, "prompt_token_ids"),
        ({"prompt_token_ids": [5] * 300}, "prompt"),  # longer than the 256-token context
        ({"prompt": "hi", "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt": "hi", "max_new_tokens": -3}, "max_new_tokens"),
        ({"prompt": "hi", "max_new_tokens": 10_000}, "max_new_tokens"),  # beyond the context
        ({"prompt": "hi", "sampling": SamplingParams(temperature=-1.0)}, "sampling.temperature"),
        ({"prompt": "hi", "sampling": SamplingParams(temperature=math.nan)}, "sampling.temperature"),
        ({"prompt": "hi", "sampling": SamplingParams(temperature=math.inf)}, "sampling.temperature"),
        ({"prompt": "hi", "sampling": SamplingParams(temperature=1.0, top_p=1.01)}, "sampling.top_p"),
        ({"prompt": "hi", "sampling": SamplingParams(temperature=1.0, top_p=-0.5)}, "sampling.top_p"),
        ({"prompt": "hi", "sampling": SamplingParams(temperature=1.0, top_k=-2)}, "sampling.top_k"),
        ({"prompt": "hi", "max_draft_tokens": -1}, "speculation.max_draft_tokens"),
        ({"prompt": "hi", "max_draft_tokens": 9}, "speculation.max_draft_tokens"),
    ],
)
def test_bad_requests_name_the_field(tiny, fields, field):
    engine = _engine(tiny, "llama", "ngram")
    with pytest.raises(InvalidArgument) as info:
        _generate(engine, **fields)
    assert info.value.field == field


def test_stats_split_the_time_between_draft_verify_and_coordinator(tiny):
    """The waits are measured where the engine waits: a draft that takes 20 ms shows up as at
    least 20 ms of draft wait per speculative round, and the parts never exceed the whole."""
    target = tiny("llama", TARGET_SEED)

    class SlowNgram(NgramDrafting):
        async def propose(self, request: DraftRequest) -> Drafted:
            await asyncio.sleep(0.02)
            return await super().propose(request)

    config = EngineConfig(max_draft_tokens=8, pipeline=False, adaptive=False)
    engine = SpeculativeEngine(LocalProposer(SlowNgram()), LocalVerifier(TargetVerifier(target)), target, config)
    stats = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS).stats
    speculative_rounds = stats.rounds - stats.non_speculative_rounds
    assert speculative_rounds > 0
    assert stats.draft_wait_s >= 0.02 * speculative_rounds
    assert stats.verify_wait_s > 0
    assert stats.draft_wait_s + stats.verify_wait_s <= stats.seconds


def test_drafts_outside_the_vocabulary_are_dropped_not_sent_to_the_target(tiny, references):
    target = tiny("llama", TARGET_SEED)

    class OtherVocabulary(NgramDrafting):
        async def propose(self, request: DraftRequest) -> Drafted:
            drafted = await super().propose(request)
            return Drafted(dataclasses.replace(drafted.proposal, token_ids=[target.vocab_size + 5] * request.k))

    engine = SpeculativeEngine(
        LocalProposer(OtherVocabulary()),
        LocalVerifier(TargetVerifier(target)),
        target,
        EngineConfig(max_draft_tokens=8, adaptive=False),
    )
    result = _generate(engine, prompt_token_ids=PROMPT, max_new_tokens=NEW_TOKENS, max_draft_tokens=4)
    assert result.token_ids == references("llama")
    assert result.stats.draft_tokens == 0 and result.stats.non_speculative_rounds == result.stats.rounds
