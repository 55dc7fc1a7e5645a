"""The acceptance rule keeps the target distribution exactly (and greedy keeps the argmax path).

Each distribution check draws 100,000 seeded rounds through the real `verify_sampled` and applies
a chi-square goodness-of-fit test against the target rows. The seeds are fixed, so the verdict is
reproducible; `test_chi_square_catches_wrong_rules` shows the same check rejects a wrong residual
and a missing bonus token, so a pass means something.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from specdec.core import rng
from specdec.core.acceptance import DraftProposal, verify_greedy, verify_sampled
from specdec.core.rng import Stream
from specdec.core.sampling import SamplingParams, warp

N = 100_000
ALPHA = 1e-4  # a correct sampler fails with probability 1e-4 per check; a wrong one with ~1

P = torch.tensor(
    [
        [0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02],
        [0.02, 0.05, 0.08, 0.10, 0.10, 0.15, 0.20, 0.30],
        [0.125] * 8,
    ]
)  # (k+1, vocab) target rows for positions 0, 1 and the bonus position 2


def _normalized(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.sum(dim=-1, keepdim=True)


# Disjoint: p puts no mass on tokens 6, 7 (position 0) and 0, 1 (position 1), where q lives.
P_DISJOINT = _normalized(P * torch.tensor([[1.0] * 6 + [0.0] * 2, [0.0] * 2 + [1.0] * 6, [1.0] * 8]))

CASES = {  # name -> (p, q)
    "far": (
        P,
        torch.tensor([[0.02, 0.02, 0.02, 0.02, 0.02, 0.10, 0.30, 0.50], [0.5, 0.3, 0.1, 0.02, 0.02, 0.02, 0.02, 0.02]]),
    ),
    "equal": (P, P[:2].clone()),
    "disjoint": (P_DISJOINT, torch.tensor([[0.0] * 6 + [0.5, 0.5], [0.5, 0.5] + [0.0] * 6])),
}


def _run_rounds(sampler, p: torch.Tensor, q: torch.Tensor | None) -> list[list[int]]:
    """Per output position, the tokens produced there over N seeded rounds."""
    per_position: list[list[int]] = [[] for _ in range(p.shape[0])]
    for seed in range(N):
        if q is None:
            draft = [1, 6]  # a fixed point-mass proposal, like the n-gram drafter's
        else:
            draft = [rng.sample(q[i], seed, i, Stream.DRAFT) for i in range(q.shape[0])]
        result = sampler(p, DraftProposal(draft, q), seed, 0)
        for position, token in enumerate(result.accepted_ids):
            per_position[position].append(token)
    return per_position


def _chi_square_pvalue(tokens: list[int], probs: torch.Tensor) -> float:
    observed = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    support = probs > 0
    if bool((observed[~support] > 0).any()):
        return 0.0  # a token the target can never produce
    expected = probs[support].double()
    expected = expected / expected.sum() * float(observed.sum())  # fp32 rows sum to 1 only approximately
    return float(chisquare(observed[support].numpy(), expected.numpy()).pvalue)


def _assert_matches_target(per_position: list[list[int]], p: torch.Tensor) -> None:
    for position, tokens in enumerate(per_position):
        # Position 0 always gets a token; later ones only after acceptances, but every rule here
        # accepts often enough that each position sees thousands of samples.
        assert len(tokens) >= 1000 or position == 0 and len(tokens) == N, (position, len(tokens))
        pvalue = _chi_square_pvalue(tokens, p[position])
        assert pvalue > ALPHA, f"position {position}: chi-square p-value {pvalue:.2e} over {len(tokens)} samples"


@pytest.mark.parametrize("case", CASES)
def test_rejection_sampling_matches_target(case):
    p, q = CASES[case]
    per_position = _run_rounds(verify_sampled, p, q)
    if case == "disjoint":
        # Every draft is rejected, so only position 0 is ever produced, from the residual (= p).
        assert per_position[1] == [] and per_position[2] == []
        pvalue = _chi_square_pvalue(per_position[0], p[0])
        assert pvalue > ALPHA, pvalue
    else:
        _assert_matches_target(per_position, P)
    if case == "equal":
        assert len(per_position[2]) == N  # q == p: nothing is ever rejected, the bonus is always drawn


def test_point_mass_proposal_matches_target_and_target_only_sampling():
    per_position = _run_rounds(verify_sampled, P, None)
    _assert_matches_target(per_position, P)
    # Pathwise: the first token equals what target-only sampling draws with the same seed.
    for seed in range(200):
        result = verify_sampled(P, DraftProposal([1, 6]), seed, 0)
        assert result.accepted_ids[0] == rng.sample(P[0], seed, 0, Stream.TARGET)


def _wrong_residual_sampler(p, proposal, seed, first_position):
    """The classic bug: on rejection, draw from p instead of norm(max(0, p - q))."""
    for i, x in enumerate(proposal.token_ids):
        q_x, p_x = float(proposal.draft_probs[i, x]), float(p[i, x])
        if rng.uniform(seed, first_position + i) * q_x < p_x:
            continue
        y = rng.sample(p[i], seed, first_position + i, Stream.TARGET)
        return verify_sampled.__globals__["Verification"](proposal.token_ids[:i] + [y], i, y)
    k = len(proposal.token_ids)
    return verify_sampled.__globals__["Verification"](proposal.token_ids[:], k, -1)  # and no bonus


def test_chi_square_catches_wrong_rules():
    per_position = _run_rounds(_wrong_residual_sampler, P, CASES["far"][1])
    assert _chi_square_pvalue(per_position[0], P[0]) < ALPHA  # wrong residual is caught
    assert len(per_position[2]) == 0  # a missing bonus leaves the last position empty: caught above


def test_warping_is_exact_and_shared():
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.8, seed=1)
    probs = warp(logits, params)[0]
    # Reference: scale by 1/T, keep the top 5, then the smallest prefix with mass >= 0.8.
    full = torch.softmax(logits[0] / 0.7, dim=-1)
    top5 = torch.zeros(8)
    top5[:5] = full[:5] / full[:5].sum()
    cumulative = torch.cumsum(top5, dim=0)
    keep = int((cumulative < 0.8).sum()) + 1
    expected = torch.zeros(8)
    expected[:keep] = top5[:keep] / top5[:keep].sum()
    assert torch.allclose(probs, expected, atol=1e-6)
    assert 1 < keep < 5  # both filters were active


def test_speculative_sampling_under_top_k_top_p_matches_warped_target():
    gen = torch.Generator().manual_seed(0)
    target_logits = torch.randn(3, 8, generator=gen) * 2
    draft_logits = target_logits[:2] + torch.randn(
        2, 8, generator=gen
    )  # a decent draft: both positions get accepted often
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.9, seed=0)
    p, q = warp(target_logits, params), warp(draft_logits, params)
    assert bool((p == 0).any()) and bool((q == 0).any())  # the filters cut the support
    _assert_matches_target(_run_rounds(verify_sampled, p, q), p)


def test_seeded_sampling_is_independent_of_k_for_point_mass_drafts():
    # Cutting the same draft into rounds of different k yields the same tokens: every draw is
    # keyed by absolute position, so fallback to k = 0 or adaptive k cannot change seeded text.
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(6, 8, generator=gen), dim=-1)
    one_round = verify_sampled(p, DraftProposal([2, 2, 5, 1, 0]), 42, 10).accepted_ids
    token_by_token = [rng.sample(p[i], 42, 10 + i, Stream.TARGET) for i in range(6)]
    assert one_round == token_by_token[: len(one_round)]


def test_greedy_verification():
    logits = torch.full((4, 8), -1.0)
    for position, best in enumerate([3, 5, 7, 1]):
        logits[position, best] = 1.0
    assert verify_greedy(logits, [3, 5, 7]).accepted_ids == [3, 5, 7, 1]  # all accepted + bonus
    result = verify_greedy(logits, [3, 4, 7])
    assert (result.accepted_ids, result.num_accepted, result.bonus_token) == ([3, 5], 1, 5)
    assert verify_greedy(logits[:1], []).accepted_ids == [3]  # k = 0 is plain decoding


@pytest.mark.parametrize(
    "params, field",
    [
        (SamplingParams(temperature=-0.1), "sampling.temperature"),
        (SamplingParams(temperature=math.nan), "sampling.temperature"),
        (SamplingParams(temperature=math.inf), "sampling.temperature"),
        (SamplingParams(temperature=1.0, top_p=1.5), "sampling.top_p"),
        (SamplingParams(temperature=1.0, top_p=-0.1), "sampling.top_p"),
        (SamplingParams(temperature=1.0, top_k=-1), "sampling.top_k"),
    ],
)
def test_bad_sampling_params_name_the_field(params, field):
    with pytest.raises(ValueError) as info:
        params.validate()
    assert info.value.field == field


def test_keyed_uniforms_are_the_same_bits_on_the_host_and_in_tensor_ops():
    """A GPU computes the keyed uniforms with int64 tensor ops; the host with Python ints. Both
    give the same 53 bits, so a seed means the same draws wherever a round is verified."""
    keys = [
        rng.key(seed, position, stream) for seed in (0, 7, 2**63 + 5) for position in range(300) for stream in Stream
    ]
    host = rng.uniforms(keys)
    assert torch.equal(rng._uniforms_tensor(keys, "cpu"), host)
    assert bool((host > 0).all() and (host < 1).all()) and len(set(host.tolist())) == len(keys)
