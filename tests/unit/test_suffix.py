"""The suffix drafter on its own: the longest match wins, the most frequent continuation is
drafted, the draft length follows the match length, and the cache of completions stays bounded
with an index that always equals one rebuilt from what the cache holds."""

from __future__ import annotations

import random

import pytest

from specdec.draft_service.suffix import _END, SuffixCache, SuffixConfig, SuffixDrafter

LONG = SuffixConfig(max_spec_factor=4.0, max_spec_offset=4.0)  # drafts up to k on any match


def test_the_longest_suffix_match_in_the_context_is_continued():
    drafter = SuffixDrafter(LONG)
    #           a  b  c  X  ...  b  c  Y  ...  a  b  c   -> "a b c" matched at the start: X follows
    context = [1, 2, 3, 10, 11, 2, 3, 20, 21, 1, 2, 3]
    assert drafter.propose(context, 2) == [10, 11]
    assert drafter.last == "context"
    assert drafter.propose([5, 6, 7], 4) == []  # nothing repeats: no draft


def test_the_draft_length_follows_the_match_length():
    drafter = SuffixDrafter(SuffixConfig(max_spec_factor=1.0, max_spec_offset=1.0))
    assert drafter.propose([7, 8, 9, 1, 2, 3, 4, 5, 6, 0, 7, 8, 9], 8) == [1, 2, 3, 4]  # 3 matched: 3 + 1
    assert drafter.propose([8, 98, 99, 97, 96, 0, 8], 8) == [98, 99]  # 1 matched: 1 + 1


def test_completions_of_earlier_requests_are_drafted_by_frequency():
    drafter = SuffixDrafter(LONG)
    for tail in ([30, 31], [30, 31], [30, 31], [40, 41]):
        drafter.learn([7, 8, 9, *tail])
    assert drafter.propose([1, 8, 9], 2) == [30, 31]  # 3 of 4 completions went on with 30 31
    assert drafter.last == "cache" and drafter.stats.from_cache == 1
    drafter.learn([7, 8, 9, 40, 41])
    drafter.learn([7, 8, 9, 40, 41])
    assert drafter.propose([1, 8, 9], 2) == [40, 41]  # now 3 against 3: the most recent wins


def test_a_rare_continuation_stops_the_draft():
    drafter = SuffixDrafter(SuffixConfig(max_spec_factor=4.0, max_spec_offset=4.0, min_token_prob=0.5))
    for third in (50, 51, 52):
        drafter.learn([7, 8, 9, 30, third])
    # 30 follows every time (frequency 1), then three different tokens (1/3 each < 0.5): stop.
    assert drafter.propose([1, 8, 9], 4) == [30]


def test_a_longer_match_beats_a_more_recent_shorter_one_across_sources():
    drafter = SuffixDrafter(LONG)
    drafter.learn([4, 5, 6, 7, 8, 60, 61])  # matches the context's last 5 tokens
    context = [8, 70, 71, 3, 5, 6, 7, 8]  # in the context, "8" alone matches (one token)
    assert drafter.propose(context, 2) == [60, 61]


def test_the_cache_is_bounded_and_its_index_is_exact():
    rng = random.Random(0)
    cache = SuffixCache(capacity=200)
    for _ in range(300):
        cache.add([rng.randrange(12) for _ in range(rng.randrange(1, 40))])
        assert cache.tokens <= 200
        live = [cache._at(p) for p in range(cache.start, cache.end)]
        rebuilt: dict[tuple[int, int], list[int]] = {}
        for offset in range(len(live) - 1):
            if live[offset] != _END and live[offset + 1] != _END:
                rebuilt.setdefault((live[offset], live[offset + 1]), []).append(cache.start + offset)
        assert {key: list(positions) for key, positions in cache.index.items()} == rebuilt


def test_a_completion_longer_than_the_cache_keeps_its_tail():
    drafter = SuffixDrafter(SuffixConfig(max_cached_tokens=16, max_spec_factor=4.0, max_spec_offset=4.0))
    drafter.learn(list(range(100, 140)))
    assert drafter.cache.tokens == 16
    assert drafter.propose([1, 135, 136], 2) == [137, 138]
    assert drafter.propose([1, 101, 102], 2) == []  # the head fell out


@pytest.mark.parametrize("bad", [dict(min_match=0), dict(min_match=5, max_match=4), dict(max_cached_tokens=1)])
def test_bad_configs_are_refused(bad):
    with pytest.raises(ValueError):
        SuffixConfig(**bad)


def test_a_tree_drafts_every_continuation_worth_it_best_first():
    """Completions that went on in several ways after "8 9": every branch is drafted, the more
    frequent first and each node after its parent; branches below min_token_prob are left out,
    and the node budget keeps the best-scored nodes."""
    completions = ([30, 31], [30, 31], [30, 32], [40, 41], [50, 51])
    drafters = [
        SuffixDrafter(SuffixConfig(max_spec_factor=4.0, max_spec_offset=4.0, min_token_prob=p)) for p in (0.15, 0.25)
    ]
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
