"""Token-tree verification in the target engine: one pass scores every node with a tree mask
(each node's logits are a plain forward's over its own branch), the walk accepts exactly what
target-only decoding emits (greedy and seeded sampling), only the accepted path's keys and values
stay, and malformed trees fail their round alone."""

from __future__ import annotations

import random

import pytest
import torch
from reference import target_only

from specdec.core import tree
from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.runtime.kv_pool import BlockTable, KVBlockPool, KVShape
from specdec.runtime.projection import forward_logits
from specdec.runtime.ragged import Row, ragged_forward, use_paged_attention
from specdec.target_service.verifier import ItemRejected, TargetVerifier, VerifyItem

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=40, seed=11)
MiB = 1 << 20


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _plain_last(model, tokens: list[int]) -> torch.Tensor:
    return forward_logits(model, 1, input_ids=torch.tensor([tokens]), use_cache=False)[0, -1]


def _branch(tokens: list[int], parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma3", "gemma2"])
@torch.inference_mode()
def test_every_node_scores_as_a_plain_forward_over_its_own_branch(tiny, kind):
    """A context past Gemma 3's sliding window (8), then a tree of 9 nodes in 4 branches beside a
    plain verify row of another session in the same pass."""
    model = tiny(kind, 1).model
    use_paged_attention(model)
    pool = KVBlockPool(KVShape.of(model.config), 4 * MiB, block_size=4)
    context, other = _ids(0, 20), _ids(1, 13)
    tokens, parents = tree.from_branches([[5, 6, 7], [5, 9], [11, 12, 13, 14], [15]])
    tables = [BlockTable(), BlockTable()]
    for table, prefix in zip(tables, (context[:-1], other[:-3])):
        pool.grow(table, len(prefix))
        ragged_forward(model, pool, [Row(table, prefix, 1)])
    pool.grow(tables[0], len(context) + len(tokens))
    pool.grow(tables[1], len(other))
    got = ragged_forward(
        model, pool, [Row(tables[0], [context[-1], *tokens], len(tokens) + 1, parents), Row(tables[1], other[-3:], 3)]
    )
    expected = [_plain_last(model, context)]
    expected += [_plain_last(model, context + _branch(tokens, parents, i)) for i in range(len(tokens))]
    expected += [_plain_last(model, other[:n]) for n in (len(other) - 2, len(other) - 1, len(other))]
    torch.testing.assert_close(got, torch.stack(expected), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_tree_rounds_give_exactly_the_target_only_output(tiny, kind, sampling):
    """Rounds whose trees hold the target's continuation (sometimes cut short or corrupted) among
    random branches, in random order: the output is target-only decoding's, token for token, and
    the accepted path's keys and values carry the next round (a wrong cache would change it)."""
    target = tiny(kind, 1)
    verifier = TargetVerifier(target)
    prompt = _ids(3, 12)
    expected = target_only(target.model, prompt, 40, target.eos_token_ids, sampling)
    choose = random.Random(5)
    generated, longest, off_first = [], 0, 0
    while len(generated) < len(expected):
        truth = expected[len(generated) : len(generated) + choose.randint(1, 4)]
        if choose.random() < 0.3:
            truth = truth[:-1] + [choose.randrange(3, 250)]
        branches = [truth, [choose.randrange(3, 250) for _ in range(3)], truth[:1] + [choose.randrange(3, 250)]]
        choose.shuffle(branches)
        tokens, parents = tree.from_branches(branches)
        result = verifier.verify("s", prompt + generated, DraftProposal(tokens, parents=parents), sampling)
        longest = max(longest, result.num_accepted)
        off_first += bool(result.path) and result.path[0] != 0
        generated += result.accepted_ids
        # The session holds the context and the accepted path (the bonus is fed next round), so
        # the next round re-sends nothing: a cache kept at the wrong positions would change it.
        assert verifier.sessions["s"].tokens == (prompt + generated)[:-1]
    assert generated[: len(expected)] == expected
    assert longest >= 3 and off_first > 0  # paths of several nodes, not only through node 0


def test_trees_and_chains_in_one_pass_decide_as_they_would_alone(tiny):
    target = tiny("llama", 1)
    tokens, parents = tree.from_branches([[40, 41], [42, 43, 44], [40, 45]])
    items = [
        VerifyItem("tree", _ids(4, 9), DraftProposal(tokens, parents=parents), SAMPLED),
        VerifyItem("chain", _ids(5, 14), DraftProposal([7, 8, 9]), GREEDY),
        VerifyItem("none", _ids(6, 3), DraftProposal([]), SAMPLED),
        VerifyItem("greedy-tree", _ids(7, 30), DraftProposal(tokens, parents=parents), GREEDY),
    ]
    together = TargetVerifier(target).verify_batch(items)
    alone = [TargetVerifier(target).verify_batch([item])[0] for item in items]
    assert together == alone


def test_malformed_trees_fail_their_round_alone(tiny):
    verifier = TargetVerifier(tiny("llama", 1))
    bad = [
        DraftProposal([5, 6], parents=[-1]),  # one parent for two tokens
        DraftProposal([5, 6], parents=[-1, 1]),  # its own parent
        DraftProposal([5, 6], parents=[0, -1]),  # a parent after its child
        DraftProposal([5, 6], torch.full((2, 256), 1 / 256), parents=[-1, -1]),  # model drafts in a tree
    ]
    for proposal in bad:
        bad_item, ok = (
            VerifyItem("bad", [1, 2, 3], proposal, GREEDY),
            VerifyItem("ok", [1, 2], DraftProposal([3]), GREEDY),
        )
        results = verifier.step([bad_item, ok])
        assert isinstance(results[bad_item], ItemRejected), proposal
        assert ok in results and not isinstance(results[ok], Exception)
