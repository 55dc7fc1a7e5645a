from specdec.draft_service.ngram import NgramConfig, NgramDrafter


def test_proposes_the_continuation_of_the_longest_most_recent_match():
    drafter = NgramDrafter(NgramConfig(max_ngram=3))
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3]
    assert drafter.propose(tokens, 2) == [5, 6]  # suffix [2, 3]: most recent earlier match at 5
    assert drafter.propose(tokens + [4], 3) == [9, 2, 3]  # [2, 3, 4] occurs once, at 1


def test_no_match_and_edge_cases_propose_nothing():
    drafter = NgramDrafter()
    assert drafter.propose([1, 2, 3, 4], 4) == []
    assert drafter.propose([7], 4) == []
    assert drafter.propose([1, 1, 1], 0) == []
    assert drafter.propose([5, 6, 5], 4) == [6, 5]  # a continuation may be shorter than k
