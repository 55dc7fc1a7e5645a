"""Suffix decoding (Oliaro et al., "SuffixDecoding", arXiv 2411.04975): drafts from what followed
the context's longest suffix, in the request itself and in the completions of earlier requests.

A replica sees every request its sessions belong to. Requests that resemble one another (agent
loops, templated generation, retries, code edits) repeat text across requests, which lookup in
the request's own context cannot see. `SuffixCache` keeps the completions of recent requests,
bounded in tokens, oldest out first; `SuffixDrafter` matches the context's longest suffix
(up to `max_match` tokens) against the context itself and against that cache, and drafts along
the most frequent continuation of the matches:

- candidates are the occurrences of the longest suffix found (the most recent `max_candidates`
  of each source); at each step the most frequent next token among those still agreeing with the
  draft is taken, and the draft stops once the product of those frequencies falls below
  `min_token_prob` (the paper's path score);
- the draft length follows the match length, `max_spec_factor * L + max_spec_offset` tokens
  for a match of L tokens (a long match predicts far; a one-token match hardly at all);
- of the two sources, the one whose draft has the larger expected length (the sum of the path
  scores) answers; on a tie, the longer match.

Drafts are point masses (no q), like prompt lookup: the acceptance rule treats them exactly, so
nothing the cache holds can change an output, only how fast it comes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_END = -1  # between completions in the cache: no match or draft crosses it
_NONE = -2  # outside the cache's live window
_MAX_SCANNED = 4096  # most recent occurrences of a token pair read from the cache's index per call


@dataclass(frozen=True)
class SuffixConfig:
    max_match: int = 32  # longest context suffix matched (the paper's tree depth)
    min_match: int = 1  # shortest suffix worth drafting from; the cache is matched from 2 tokens
    max_spec_factor: float = 1.0  # a match of L tokens drafts at most factor * L + offset tokens
    max_spec_offset: float = 1.0
    min_token_prob: float = 0.1  # stop where the draft's path frequency falls below this
    max_candidates: int = 64  # most recent occurrences of the matched suffix considered, per source
    max_cached_tokens: int = 1 << 20  # completion tokens kept (4 MiB ring, index up to ~50 MiB), oldest out first

    def __post_init__(self):
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {self.min_match}, {self.max_match}")
        if self.max_cached_tokens < 2 or self.max_candidates < 1 or not 0 <= self.min_token_prob <= 1:
            raise ValueError(f"invalid suffix config {self}")


@dataclass
class SuffixStats:
    lookups: int = 0  # propose calls
    from_context: int = 0  # answered from the request's own tokens
    from_cache: int = 0  # answered from earlier requests' completions
    learned: int = 0  # completions added to the cache
    evicted_tokens: int = 0


class SuffixCache:
    """Recent completions in one ring of token ids (completions separated by _END), with an index
    from each token pair to the positions where it starts, in order. Positions are global
    (they only grow); the live window is the last `capacity` of them. Eviction takes the oldest
    positions out of the index exactly, so the index never holds more than the ring."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.ring = np.full(capacity, _END, dtype=np.int32)
        self.end = 0  # global position after the last token written
        self.index: dict[tuple[int, int], deque[int]] = {}

    @property
    def start(self) -> int:
        return max(0, self.end - self.capacity)

    @property
    def tokens(self) -> int:
        return self.end - self.start

    def nbytes(self) -> int:
        """The ring plus an estimate of the index (a tuple key, a deque and a boxed int per entry)."""
        entries = sum(len(positions) for positions in self.index.values())
        return self.ring.nbytes + 200 * len(self.index) + 40 * entries

    def add(self, completion: Sequence[int]) -> int:
        """Append a completion (the longest tail that fits); returns the tokens evicted for it."""
        tokens = list(completion)[-(self.capacity - 1) :]
        if not tokens:
            return 0
        old_start = self.start
        new_end = self.end + len(tokens) + 1
        new_start = max(0, new_end - self.capacity)
        self._evict(old_start, new_start)
        for offset, token in enumerate([*tokens, _END]):
            self.ring[(self.end + offset) % self.capacity] = token
        for offset in range(len(tokens) - 1):
            key = (tokens[offset], tokens[offset + 1])
            self.index.setdefault(key, deque()).append(self.end + offset)
        self.end = new_end
        return max(0, new_start - old_start)

    def _evict(self, old_start: int, new_start: int) -> None:
        """Drop the index entries of positions [old_start, new_start), which the next write overwrites."""
        for position in range(old_start, min(new_start, self.end - 1)):
            first, second = self._at(position), self._at(position + 1)
            if first == _END or second == _END:
                continue
            positions = self.index[(first, second)]
            positions.popleft()  # the oldest entry of its pair: positions were appended in order
            if not positions:
                del self.index[(first, second)]

    def _at(self, position: int) -> int:
        return int(self.ring[position % self.capacity])

    def window(self, positions: np.ndarray) -> np.ndarray:
        """Tokens at global `positions` (any shape); _NONE outside the live window."""
        live = (positions >= self.start) & (positions < self.end)
        return np.where(live, self.ring[positions % self.capacity], _NONE)


class SuffixDrafter:
    def __init__(self, config: SuffixConfig = SuffixConfig()):
        self.config = config
        self.cache = SuffixCache(config.max_cached_tokens)
        self.stats = SuffixStats()
        self.last = "none"  # where the last proposal came from: "context", "cache" or "none"

    def learn(self, completion: Sequence[int]) -> None:
        """Remember a finished request's completion (its output tokens, prompt excluded)."""
        if len(completion) >= 2:
            self.stats.learned += 1
            self.stats.evicted_tokens += self.cache.add(completion)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens: the better of the request's own and the cache's suffix drafts."""
        return self._best(tokens, k, self._draft) or []

    def propose_tree(self, tokens: Sequence[int], nodes: int) -> tuple[list[int], list[int]]:
        """A token tree of up to `nodes` nodes (tokens, parent indices; `specdec.core.tree`): the
        matches' continuations expanded best first by path frequency, so where they disagree
        several branches are drafted at once (the paper's speculation tree)."""
        return self._best(tokens, nodes, self._draft_tree) or ([], [])

    def _best(self, tokens: Sequence[int], k: int, draft):
        """`draft`'s answer for the better of the request's own and the cache's matches."""
        self.stats.lookups += 1
        self.last = "none"
        if k <= 0 or not tokens:
            return None
        context = np.asarray(tokens, dtype=np.int64)
        reversed_suffix = context[::-1][: self.config.max_match]
        own_match, own_following = self._in_context(context, reversed_suffix)
        cache_match, cache_following = self._in_cache(context, reversed_suffix)
        own = (*draft(own_match, own_following, k), own_match)
        cached = (*draft(cache_match, cache_following, k), cache_match)
        best = max(own, cached, key=lambda d: d[1:])  # expected length, then match length
        if best[1] <= 0:  # every drafted token adds a positive score: nothing drafted
            return None
        if best is own:
            self.stats.from_context += 1
            self.last = "context"
        else:
            self.stats.from_cache += 1
            self.last = "cache"
        return best[0]

    def _in_context(self, context: np.ndarray, reversed_suffix: np.ndarray) -> tuple[int, np.ndarray]:
        """(match length, continuations) of the longest suffix's most recent earlier occurrences."""
        n = len(context)
        if n < 2:
            return 0, np.empty((0, 0), dtype=np.int64)
        # Candidates: every earlier position whose token is the context's last one and which is
        # followed by a token (so the suffix never matches itself).
        ends = np.flatnonzero(context[:-1] == context[-1])
        ends = self._narrow(ends, lambda at: np.where(at >= 0, context[np.maximum(at, 0)], _NONE), reversed_suffix)
        depth = len(reversed_suffix)
        back = ends[:, None] - np.arange(depth)[None, :]
        earlier = np.where(back >= 0, context[np.maximum(back, 0)], _NONE)
        return self._longest(earlier, reversed_suffix, ends, lambda at: _slice(context, at, self.config.max_match))

    def _in_cache(self, context: np.ndarray, reversed_suffix: np.ndarray) -> tuple[int, np.ndarray]:
        if len(context) < 2:
            return 0, np.empty((0, 0), dtype=np.int64)
        positions = self.cache.index.get((int(context[-2]), int(context[-1])))
        if not positions:
            return 0, np.empty((0, 0), dtype=np.int64)
        count = min(len(positions), _MAX_SCANNED)
        ends = np.fromiter((positions[-1 - i] for i in range(count)), dtype=np.int64, count=count)[::-1] + 1
        ends = self._narrow(ends, self.cache.window, reversed_suffix)
        depth = len(reversed_suffix)
        earlier = self.cache.window(ends[:, None] - np.arange(depth)[None, :])
        return self._longest(
            earlier,
            reversed_suffix,
            ends,
            lambda at: self.cache.window(at[:, None] + 1 + np.arange(self.config.max_match)[None, :]),
        )

    def _narrow(self, ends: np.ndarray, token_at, reversed_suffix: np.ndarray) -> np.ndarray:
        """The most recent max_candidates of `ends`, after keeping, while more than that remain,
        only those matching one more token of the suffix: a frequent token's many occurrences
        must not crowd out an older but longer match."""
        step = 1
        while len(ends) > self.config.max_candidates and step < len(reversed_suffix):
            narrower = ends[token_at(ends - step) == reversed_suffix[step]]
            if len(narrower) == 0:
                break
            ends, step = narrower, step + 1
        return ends[-self.config.max_candidates :]

    def _longest(self, earlier, reversed_suffix, ends, continuation) -> tuple[int, np.ndarray]:
        """Of candidate occurrences ending at `ends` (their tokens backwards in `earlier`), those
        matching the longest suffix, with the tokens that followed each (rows, oldest first)."""
        if len(ends) == 0:
            return 0, np.empty((0, 0), dtype=np.int64)
        matched = (earlier == reversed_suffix[None, :]).cumprod(axis=1).sum(axis=1)
        longest = int(matched.max())
        if longest < self.config.min_match:
            return 0, np.empty((0, 0), dtype=np.int64)
        return longest, continuation(ends[matched == longest])

    def _draft(self, match: int, following: np.ndarray, k: int) -> tuple[list[int], float]:
        """Walk the most frequent continuation of `following` (one row per occurrence, the most
        recent last): (draft, expected accepted length = the sum of its path frequencies)."""
        if match == 0 or following.size == 0:
            return [], 0.0
        c = self.config
        length = min(k, int(c.max_spec_factor * match + c.max_spec_offset), following.shape[1])
        rows = following
        draft: list[int] = []
        path, expected = 1.0, 0.0
        for step in range(length):
            column = rows[:, step]
            column = column[column >= 0]  # _END or _NONE: that occurrence has no more tokens
            if column.size == 0:
                break
            values, counts = np.unique(column, return_counts=True)
            best = counts.max()
            # Ties go to the token that followed the most recent occurrence among the tied.
            tied = set(values[counts == best].tolist())
            token = next(int(t) for t in column[::-1] if int(t) in tied)
            path *= best / len(rows)
            if path < c.min_token_prob:
                break
            draft.append(token)
            expected += path
            rows = rows[rows[:, step] == token]
        return draft, expected

    def _draft_tree(self, match: int, following: np.ndarray, nodes: int) -> tuple[tuple[list[int], list[int]], float]:
        """Expand the continuations of `following` best first: each node's children are the
        tokens that followed its path, scored by path frequency; the `nodes` best-scored nodes
        above min_token_prob, at most the match-length depth, form the tree ((tokens, parents),
        expected accepted length = the sum of their scores). A child scores at most its parent,
        so parents are taken first."""
        if match == 0 or following.size == 0:
            return ([], []), 0.0
        c = self.config
        depth_limit = min(int(c.max_spec_factor * match + c.max_spec_offset), following.shape[1])
        tokens: list[int] = []
        parents: list[int] = []
        expected = 0.0
        frontier: list[tuple[float, int, int, int, np.ndarray, int]] = []  # (-score, order, token, parent, rows, depth)
        order = 0

        def expand(rows: np.ndarray, depth: int, score: float, parent: int) -> None:
            nonlocal order
            if depth >= depth_limit:
                return
            column = rows[:, depth]
            values, counts = np.unique(column[column >= 0], return_counts=True)
            for token, count in zip(values.tolist(), counts.tolist()):
                child = score * count / len(rows)
                if child >= c.min_token_prob:
                    heapq.heappush(frontier, (-child, order, token, parent, rows[column == token], depth + 1))
                    order += 1

        expand(following, 0, 1.0, -1)
        while frontier and len(tokens) < nodes:
            negative, _, token, parent, rows, depth = heapq.heappop(frontier)
            tokens.append(token)
            parents.append(parent)
            expected -= negative
            expand(rows, depth, -negative, len(tokens) - 1)
        return (tokens, parents), expected


def _slice(context: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """Rows of the `width` tokens after each position in `ends` (_END past the context's end)."""
    at = ends[:, None] + 1 + np.arange(width)[None, :]
    return np.where(at < len(context), context[np.minimum(at, len(context) - 1)], _END)
