"""The acceptance rule: one copy, used by every verifier.

Greedy: accept draft tokens while they equal the target's argmax; the first mismatch is replaced
by the target's argmax, and if all k match the target adds its own (k+1)-th token.

Sampling: modified rejection sampling (Leviathan et al. 2023, "Fast Inference from Transformers
via Speculative Decoding", Alg. 1; Chen et al. 2023, "Accelerating LLM Decoding with Speculative
Sampling"). Draft token x_i ~ q_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection the output is drawn from the residual norm(max(0, p_i - q_i)); if all k are
accepted, a bonus token is drawn from p_{k+1}. Every output token is then distributed exactly as
the target's warped distribution p.

A proposal without q (the n-gram drafter, or any deterministic proposer) is a point mass at x_i.
For it the rule reduces to "accept with probability p_i(x_i), else draw from p_i without x_i",
which we realise by drawing y_i ~ p_i with the request's keyed noise and accepting iff y_i == x_i:
same distribution, and the output is token for token what target-only sampling with that seed
gives, whatever k was (this is what lets the engine fall back to k = 0 mid-request unseen).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core import rng
from specdec.core.rng import Stream


@dataclass
class DraftProposal:
    token_ids: list[int]  # the k proposed tokens, x_1..x_k
    draft_probs: torch.Tensor | None = None  # (k, vocab) q the tokens were drawn from; None = point mass
    # Which drafter answered: "ngram" (prompt lookup), "model", "ngram_short" (a hybrid's match
    # shorter than its min_match), "" unknown. The engine prices lookups and model drafts apart.
    source: str = ""


@dataclass
class Verification:
    accepted_ids: list[int]  # num_accepted draft tokens, then the target's own token (1..k+1 in all)
    num_accepted: int  # draft tokens accepted, 0..k
    bonus_token: int  # the target's own last token: the correction at a rejection, or the bonus


def verify_greedy(target_logits: torch.Tensor, draft_ids: list[int]) -> Verification:
    """target_logits: (k+1, vocab) at the positions of x_1..x_k and the one after."""
    target_ids = torch.argmax(target_logits, dim=-1).tolist()  # (k+1,)
    n = 0
    while n < len(draft_ids) and draft_ids[n] == target_ids[n]:
        n += 1
    return Verification(draft_ids[:n] + [target_ids[n]], n, target_ids[n])


def verify_sampled(
    target_probs: torch.Tensor,
    proposal: DraftProposal,
    seed: int,
    first_position: int,
) -> Verification:
    """Speculative sampling for one sequence.

    target_probs: (k+1, vocab) warped p at positions first_position .. first_position + k, where
    first_position is the absolute index x_1 would take in the sequence.
    proposal.draft_probs: (k, vocab) warped q, or None for a point-mass proposal.
    """
    draft_ids = proposal.token_ids
    k = len(draft_ids)
    assert target_probs.shape[0] == k + 1, (target_probs.shape, k)
    q = proposal.draft_probs
    for i, x in enumerate(draft_ids):
        position = first_position + i
        p_i = target_probs[i]  # (vocab,)
        if q is None:
            y = rng.sample(p_i, seed, position, Stream.TARGET)
            if y == x:
                continue
            return Verification(draft_ids[:i] + [y], i, y)
        q_x, p_x = float(q[i, x]), float(p_i[x])
        # u < p/q, written without the division so q_x == 0 (impossible for a real draw) rejects.
        if rng.uniform(seed, position, Stream.ACCEPT) * q_x < p_x:
            continue
        residual = torch.clamp(p_i - q[i].to(p_i.dtype), min=0.0)  # (vocab,)
        if float(residual.sum()) <= 0.0:
            # p <= q everywhere means p == q up to rounding, where rejection has probability ~0;
            # drawing from p is the limit of the residual rule.
            residual = p_i
        y = rng.sample(residual, seed, position, Stream.TARGET)
        return Verification(draft_ids[:i] + [y], i, y)
    bonus = rng.sample(target_probs[k], seed, first_position + k, Stream.TARGET)
    return Verification(list(draft_ids) + [bonus], k, bonus)
