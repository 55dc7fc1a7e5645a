"""The suffix drafter on its own: every earlier occurrence of the context's last token is a
candidate weighing the cube of its match length, the heaviest continuation is drafted while
its score (its weight over the total plus the evidence prior) stays above min_token_prob, trees
take the best-scored nodes first, and the cache of completions stays bounded with an index that
always equals one rebuilt from what the cache holds."""

from __future__ import annotations

import random

import pytest

from specdec.draft_service.suffix import _END, SuffixCache, SuffixConfig, SuffixDrafter


def test_the_longest_suffix_match_in_the_context_is_continued():
    drafter = SuffixDrafter()
    #           a  b  c  X   Y  ...  b  c  Z  ...  a  b  c   -> "a b c" (27) outweighs "b c" (8)
    context = [1, 2, 3, 10, 11, 2, 3, 20, 21, 1, 2, 3]
    assert drafter.propose(context, 2) == [10, 11]
    assert drafter.last == "context" and drafter.stats.from_context == 1
    assert drafter.propose([5, 6, 7], 4) == []  # nothing repeats: no draft
    assert drafter.last == "none"


def test_the_draft_length_follows_the_evidence():
    """A lone one-token match scores 1 / (1 + prior): drafted only while that reaches
    min_token_prob; a longer match keeps its whole continuation above it."""
    strict = SuffixDrafter(SuffixConfig(min_token_prob=0.3))
    assert strict.propose([8, 98, 99, 97, 96, 0, 8], 8) == []  # 1 / 5 < 0.3
    assert strict.propose([7, 8, 9, 1, 2, 3, 4, 0, 7, 8, 9], 8) == [1, 2, 3, 4, 0, 7, 8, 9]  # 27 / 31
    loose = SuffixDrafter(SuffixConfig(min_token_prob=0.2))
    assert loose.propose([8, 98, 99, 97, 96, 0, 8], 3) == [98, 99, 97]


def test_completions_of_earlier_requests_are_drafted_by_weight():
    drafter = SuffixDrafter()
    for tail in ([30, 31], [30, 31], [30, 31], [40, 41]):
        drafter.learn([7, 8, 9, *tail])
    assert drafter.propose([1, 8, 9], 2) == [30, 31]  # 3 of 4 completions went on with 30 31
    assert drafter.last == "cache" and drafter.stats.from_cache == 1
    drafter.learn([7, 8, 9, 40, 41])
    drafter.learn([7, 8, 9, 40, 41])
    assert drafter.propose([1, 8, 9], 2) == [40, 41]  # now 3 against 3: the most recent wins


def test_a_rare_continuation_stops_the_draft():
    drafter = SuffixDrafter(SuffixConfig(min_token_prob=0.4))
    for third in (50, 51, 52):
        drafter.learn([7, 8, 9, 30, third])
    # Three 2-token matches (weight 8 each, 24 of 28 with the prior): 30 scores 0.86, then each
    # third token 8 / 28 = 0.29 < 0.4: stop.
    assert drafter.propose([1, 8, 9], 4) == [30]


def test_shorter_matches_vote_and_a_longer_match_outweighs_them():
    drafter = SuffixDrafter()
    drafter.learn([4, 5, 6, 7, 8, 60, 61])  # matches the context's last 5 tokens: weight 125
    context = [8, 70, 71, 8, 70, 71, 3, 5, 6, 7, 8]  # "8" alone twice in the context: weight 1 each
    assert drafter.propose(context, 2) == [60, 61]
    assert drafter.last == "cache"
    # One-token matches only, across both sources: the continuation most of them share wins.
    voted = SuffixDrafter()
    voted.learn([1, 8, 50, 51])
    voted.learn([2, 8, 50, 51])
    assert voted.propose([9, 8, 70, 71, 3, 8], 2) == [50, 51]  # 2 cache votes against 1 in the context


def test_the_cache_is_bounded_and_its_index_is_exact():
    rng = random.Random(0)
    cache = SuffixCache(capacity=200)
    for _ in range(300):
        cache.add([rng.randrange(12) for _ in range(rng.randrange(1, 40))])
        assert cache.tokens <= 200
        live = [cache._at(p) for p in range(cache.start, cache.end)]
        rebuilt: dict[int, list[int]] = {}
        for offset, token in enumerate(live):
            if token != _END:
                rebuilt.setdefault(token, []).append(cache.start + offset)
        assert {key: list(positions) for key, positions in cache.index.items()} == rebuilt


def test_a_completion_longer_than_the_cache_keeps_its_tail():
    drafter = SuffixDrafter(SuffixConfig(max_cached_tokens=16))
    drafter.learn(list(range(100, 140)))
    assert drafter.cache.tokens == 16
    assert drafter.propose([1, 135, 136], 2) == [137, 138]
    assert drafter.propose([1, 101, 102], 2) == []  # the head fell out


BAD_CONFIGS = [
    dict(max_match=0),
    dict(max_cached_tokens=1),
    dict(min_token_prob=1.5),
    dict(evidence_prior=-1),
    dict(match_power=-1),
]


@pytest.mark.parametrize("bad", BAD_CONFIGS)
def test_bad_configs_are_refused(bad):
    with pytest.raises(ValueError):
        SuffixConfig(**bad)


def test_a_tree_drafts_every_continuation_worth_it_best_first():
    """Completions that went on in several ways after "8 9": every branch is drafted, the heavier
    first and each node after its parent; branches below min_token_prob are left out, and the
    node budget keeps the best-scored nodes."""
    completions = ([30, 31], [30, 31], [30, 32], [40, 41], [50, 51])
    drafters = [SuffixDrafter(SuffixConfig(evidence_prior=0.0, min_token_prob=p)) for p in (0.15, 0.25)]
    for drafter in drafters:
        for tail in completions:
            drafter.learn([7, 8, 9, *tail])
    tokens, parents = drafters[0].propose_tree([1, 8, 9], 8)
    # 30 (3/5) -> 31 (2/5), 32 (1/5); 40 (1/5) -> 41 (1/5); 50 (1/5) -> 51 (1/5)
    assert tokens[:2] == [30, 31] and parents[:2] == [-1, 0] and drafters[0].last == "cache"
    assert sorted(tokens) == [30, 31, 32, 40, 41, 50, 51]
    assert all(p < i for i, p in enumerate(parents))
    assert all(tokens[p] == {31: 30, 32: 30, 41: 40, 51: 50}[t] for t, p in zip(tokens, parents) if p >= 0)
    assert drafters[0].propose_tree([1, 8, 9], 2) == ([30, 31], [-1, 0])  # the two best nodes
    assert drafters[1].propose_tree([1, 8, 9], 8) == ([30, 31], [-1, 0])  # the 1/5 branches fall below 0.25
    assert drafters[0].propose_tree([5, 6], 4) == ([], [])  # nothing matches
