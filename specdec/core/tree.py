"""Token trees: several candidate continuations verified in one target pass (SpecInfer, Miao et
al. 2024; EAGLE-2, Li et al. 2024).

A tree of n draft nodes is given by its tokens and `parents`: parents[i] is the index of node i's
parent, or -1 for a child of the root (the last committed token, whose logits predict the first
draft position). Parents come before their children (parents[i] < i), so a chain is
parents == [-1, 0, 1, ..., n-2]. The target scores every node in one pass, each node attending
to the context and to its own ancestors only; node i sits at position root + depth(i).

Acceptance walks from the root: at each node the target's token there (its argmax, or its keyed
draw when sampling with point-mass drafts) is looked up among the node's children; a child that
carries it is accepted and the walk goes on from it, otherwise the target's token ends the round.
That is exactly the token target-only decoding would emit at each position, so greedy output
and seeded sampled output are unchanged by any tree. Model drafts (with probabilities q) verify
as chains only: the tree rule for them (multi-draft rejection sampling) is not implemented.
"""

from __future__ import annotations

from collections.abc import Sequence


def is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def check(parents: Sequence[int], nodes: int) -> None:
    """ValueError unless `parents` describes a tree of `nodes` nodes in topological order."""
    if len(parents) != nodes:
        raise ValueError(f"{len(parents)} parent indices for {nodes} draft tokens")
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"draft token {i} has parent {p}: a parent is -1 (the root) or an earlier token")


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 for a child of the root."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def ancestry(parents: Sequence[int]) -> list[set[int]]:
    """For each node, itself and its ancestors (node indices)."""
    out: list[set[int]] = []
    for i, p in enumerate(parents):
        out.append({i} | (out[p] if p >= 0 else set()))
    return out


def from_branches(branches: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Candidate continuations as one tree (tokens, parents): shared prefixes merged, nodes in
    the order first seen, so parents come first."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}
    for branch in branches:
        parent = -1
        for token in branch:
            if (parent, token) not in index:
                index[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            parent = index[(parent, token)]
    return tokens, parents


def walk(target_ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> tuple[list[int], int]:
    """The accepted path (node indices, root to leaf) and the target's token after it.
    target_ids[0] is the target's token at the root, target_ids[1 + i] at node i."""
    children: dict[int, dict[int, int]] = {}
    for i, (token, p) in enumerate(zip(tokens, parents)):
        children.setdefault(p, {}).setdefault(token, i)  # a repeated sibling token: the first wins
    path: list[int] = []
    node = -1
    while True:
        wanted = target_ids[node + 1]
        child = children.get(node, {}).get(wanted)
        if child is None:
            return path, wanted
        path.append(child)
        node = child
