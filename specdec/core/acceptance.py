"""The acceptance rule: one copy, used by every verifier.

Greedy: accept draft tokens while they equal the target's argmax; the first mismatch is replaced
by the target's argmax, and if all k match the target adds its own (k+1)-th token.

Sampling: modified rejection sampling (Leviathan et al. 2023, "Fast Inference from Transformers
via Speculative Decoding", Alg. 1; Chen et al. 2023, "Accelerating LLM Decoding with Speculative
Sampling"). Draft token x_i ~ q_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection the output is drawn from the residual norm(max(0, p_i - q_i)); if all k are
accepted, a bonus token is drawn from p_{k+1}. Every output token is then distributed exactly as
the target's warped distribution p.

A proposal without q is a point mass at x_i: prompt lookup (the n-gram drafter), suffix decoding
(the default drafter, draft_service/suffix.py; Oliaro et al. 2024, "SuffixDecoding",
arXiv:2411.04975), or any deterministic proposer. For it the rule reduces to "accept with
probability p_i(x_i), else draw from p_i without x_i", which we realise by drawing y_i ~ p_i with
the request's keyed noise and accepting iff y_i == x_i: same distribution, and the output is token
for token what target-only sampling with that seed gives, whatever k was (this is what lets the
engine fall back to k = 0 mid-request unseen).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.core import rng, tree
from specdec.core.rng import Stream


@dataclass
class DraftProposal:
    token_ids: list[int]  # the k proposed tokens, x_1..x_k
    draft_probs: torch.Tensor | None = None  # (k, vocab) q the tokens were drawn from; None = point mass
    # Which drafter answered (`specdec.core.draft_source`): "ngram" (prompt lookup), "suffix"
    # (suffix decoding), "model", "ngram_short" (a hybrid's match shorter than its min_match), ""
    # unknown. The engine prices lookups and model drafts apart.
    source: str = ""
    # A token tree (`specdec.core.tree`): parents[i] is the index of token i's parent, -1 for the
    # root; None: a chain. Point-mass drafts only.
    parents: list[int] | None = None


@dataclass(frozen=True)
class PassCost:
    """What the forward pass that decided a round carried and took. Rounds of many requests share
    a pass, so a round's drafts cost every round in it: the draft-length policy prices k by the
    pass it would make (coordinator/adaptive.py)."""

    rows: int  # rounds the pass decided
    positions: int  # target positions it computed: each row's k + 1
    seconds: float  # its wall time, forward and acceptance
    ahead: bool = False  # run before its round was sent (target_service/lookahead.py): no wait was seen


@dataclass
class Verification:
    accepted_ids: list[int]  # num_accepted draft tokens, then the target's own token (1..k+1 in all)
    num_accepted: int  # draft tokens accepted, 0..k
    bonus_token: int  # the target's own last token: the correction at a rejection, or the bonus
    path: list[int] | None = None  # for a tree: the accepted nodes' indices, root to leaf
    # The pass that decided it (None when the pass also prefilled: not a round's cost). Not part
    # of the decision: equal verifications decide the same tokens whatever their passes took.
    cost: PassCost | None = field(default=None, compare=False)


def verify_greedy(target_logits: torch.Tensor, draft_ids: list[int]) -> Verification:
    """target_logits: (k+1, vocab) at the positions of x_1..x_k and the one after."""
    return resolve_greedy(greedy_decisions(target_logits).tolist(), draft_ids)


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
    values = sampled_decisions(target_probs, proposal, seed, first_position).tolist()
    return resolve_sampled(values, proposal)


# The rule in two halves, so a batched verifier decides every row of a pass on the model's device
# and reads all the decisions back in one host sync: `*_decisions` computes, for every position
# at once, whatever the rule could need there (a tensor of token ids and flags, on the device);
# `resolve_*` walks those values on the host.


def greedy_decisions(target_logits: torch.Tensor) -> torch.Tensor:
    """(k+1,) the target's argmax at each position."""
    return torch.argmax(target_logits, dim=-1)


def resolve_greedy(target_ids: list[int], draft_ids: list[int]) -> Verification:
    n = 0
    while n < len(draft_ids) and draft_ids[n] == target_ids[n]:
        n += 1
    return Verification(draft_ids[:n] + [target_ids[n]], n, target_ids[n])


def sampled_decisions(
    target_probs: torch.Tensor, proposal: DraftProposal, seed: int, first_position: int
) -> torch.Tensor:
    """Point mass: (k+1,) the target's keyed draw y_i at each position (the last is the bonus).
    With q: (2k+1,) the accept flags [u_i * q_i(x_i) < p_i(x_i)], then the keyed residual draws
    from norm(max(0, p_i - q_i)) for i < k, then the bonus draw from p_{k+1}."""
    k = len(proposal.token_ids)
    assert target_probs.shape[0] == k + 1, (target_probs.shape, k)
    positions = range(first_position, first_position + k + 1)
    keys = [rng.key(seed, position, Stream.TARGET) for position in positions]
    q = proposal.draft_probs
    if q is None:
        return rng.draw(target_probs, keys)
    device = target_probs.device
    u = rng.uniforms([rng.key(seed, position, Stream.ACCEPT) for position in positions[:k]] + keys, device)
    q = q.to(device=device, dtype=target_probs.dtype)
    x = torch.tensor(proposal.token_ids, dtype=torch.int64).to(device).unsqueeze(-1)  # (k, 1)
    p = target_probs[:k]
    # u < p/q, written without the division so q_x == 0 (impossible for a real draw) rejects.
    accept = u[:k] * q.gather(-1, x).squeeze(-1) < p.gather(-1, x).squeeze(-1)
    residual = torch.clamp(p - q, min=0.0)  # (k, vocab)
    # p <= q everywhere means p == q up to rounding, where rejection has probability ~0; drawing
    # from p is the limit of the residual rule.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) <= 0.0, p, residual)
    draws = rng.invert(torch.cat([residual, target_probs[k:]]), u[k:])  # corrections, then the bonus
    return torch.cat([accept.long(), draws])


def resolve_sampled(values: list[int], proposal: DraftProposal) -> Verification:
    draft_ids = list(proposal.token_ids)
    k = len(draft_ids)
    if proposal.draft_probs is None:
        for i, (x, y) in enumerate(zip(draft_ids, values)):
            if y != x:
                return Verification(draft_ids[:i] + [y], i, y)
        return Verification(draft_ids + [values[k]], k, values[k])
    accept, corrections, bonus = values[:k], values[k : 2 * k], values[2 * k]
    for i in range(k):
        if not accept[i]:
            return Verification(draft_ids[:i] + [corrections[i]], i, corrections[i])
    return Verification(draft_ids + [bonus], k, bonus)


def tree_decisions(target_probs: torch.Tensor, proposal: DraftProposal, seed: int, first_position: int) -> torch.Tensor:
    """(n+1,) the target's keyed draw at the root and at each node of a point-mass tree, from
    the warped probabilities there, keyed by the node's sequence position (root:
    first_position; node i: first_position + depth(i)), as target-only sampling keys it. Greedy
    trees take `greedy_decisions` (the argmax at each node)."""
    positions = [first_position] + [first_position + d for d in tree.depths(proposal.parents)]
    return rng.draw(target_probs, [rng.key(seed, position, Stream.TARGET) for position in positions])


def resolve_tree(target_ids: list[int], proposal: DraftProposal) -> Verification:
    path, bonus = tree.walk(target_ids, proposal.token_ids, proposal.parents)
    return Verification([proposal.token_ids[i] for i in path] + [bonus], len(path), bonus, path)
