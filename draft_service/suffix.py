"""Suffix decoding (Oliaro et al., "SuffixDecoding", arXiv 2411.04975): drafts from what followed
the context's suffixes, in the request itself and in the completions of earlier requests.

A replica sees every request its sessions belong to. Requests that resemble one another (agent
loops, templated generation, retries, code edits) repeat text across requests, which lookup in
the request's own context cannot see. `SuffixCache` keeps the completions of recent requests,
bounded in tokens, oldest out first; `SuffixDrafter` drafts from one pool of candidates:

- a candidate is an earlier occurrence of the context's last token, in the context or in the
  cache, with the length L of the context suffix it matches (up to `max_match`) and the tokens
  that followed it; while more than `max_candidates` of a source remain, only those matching
  one more token are kept, so a frequent token's many occurrences never crowd out a longer match;
- a candidate weighs L^`match_power` (L^3): a long match predicts far better than a one-token
  one (a copy's one 5-token match outweighs four 3-token matches elsewhere), yet the many
  one-token matches of text that was seen before still vote (most of what a similar request
  repeats is matched by one or two tokens when the round starts);
- a path's score is the weight of the candidates that continue along it over the total weight
  plus `evidence_prior` (the weight of "none of these": a lone one-token match scores 1/5, a lone
  3-token match 27/31, and a path that candidates disagree on scores its share of them, so the
  draft length follows the match length and the evidence, as the paper's path score and
  match-length limit do); a chain follows the best child while its score stays at least
  `min_token_prob`, a tree takes the best-scored nodes first. The coordinator's k caps either.

The constants were chosen on the benchmark's tuning sets (specdec/benchmark/heldout.py) by replaying the
target's outputs (bench/results/history/bench-readme-figures.md, "Drafters replayed"); the
held-out sets, through the stack, judge them.

Drafts are point masses (no q), like prompt lookup: the acceptance rule treats them exactly, so
nothing the cache holds can change an output, only how fast it comes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specdec.core.settings import setting

_END = -1  # between completions in the cache: no match or draft crosses it
_NONE = -2  # outside the cache's live window
_MAX_SCANNED = 4096  # most recent occurrences of a token read from the cache's index per call


@dataclass(frozen=True)
class SuffixConfig:
    max_match: int = 32  # longest context suffix matched (the paper's tree depth), and the longest draft
    min_token_prob: float = 0.1  # stop where the draft's path score falls below this
    evidence_prior: float = 4.0  # the weight of "none of the candidates" in every path score
    match_power: float = 3.0  # a candidate matching L tokens weighs L ** match_power
    max_candidates: int = 64  # most recent occurrences considered per source, after narrowing
    max_cached_tokens: int = setting(  # 4 MiB ring, index up to ~50 MiB
        1 << 20,
        "completion tokens a suffix drafter ('suffix', 'suffix:SPEC') keeps from earlier requests, oldest out first",
        flag="suffix-cache-tokens",
        type="positive_int",
    )

    def __post_init__(self):
        if self.max_match < 1:
            raise ValueError(f"need max_match >= 1, got {self.max_match}")
        if (
            self.max_cached_tokens < 2
            or self.max_candidates < 1
            or not 0 <= self.min_token_prob <= 1
            or self.evidence_prior < 0
            or self.match_power < 0
        ):
            raise ValueError(f"invalid suffix config {self}")


@dataclass
class SuffixStats:
    lookups: int = 0  # propose calls
    from_context: int = 0  # answered mostly from the request's own tokens
    from_cache: int = 0  # answered mostly from earlier requests' completions
    learned: int = 0  # completions added to the cache
    evicted_tokens: int = 0


class SuffixCache:
    """Recent completions in one ring of token ids (completions separated by _END), with an index
    from each token to the positions where it occurs, in order. Positions are global (they only
    grow); the live window is the last `capacity` of them. Eviction takes the oldest positions
    out of the index exactly, so the index never holds more than the ring."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.ring = np.full(capacity, _END, dtype=np.int32)
        self.end = 0  # global position after the last token written
        self.index: dict[int, deque[int]] = {}

    @property
    def start(self) -> int:
        return max(0, self.end - self.capacity)

    @property
    def tokens(self) -> int:
        return self.end - self.start

    def nbytes(self) -> int:
        """The ring plus an estimate of the index (a key, a deque and a boxed int per entry)."""
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
        for offset, token in enumerate(tokens):
            self.index.setdefault(token, deque()).append(self.end + offset)
        self.end = new_end
        return max(0, new_start - old_start)

    def _evict(self, old_start: int, new_start: int) -> None:
        """Drop the index entries of positions [old_start, new_start), which the next write overwrites."""
        for position in range(old_start, min(new_start, self.end)):
            token = self._at(position)
            if token == _END:
                continue
            positions = self.index[token]
            positions.popleft()  # the oldest entry of its token: positions were appended in order
            if not positions:
                del self.index[token]

    def _at(self, position: int) -> int:
        return int(self.ring[position % self.capacity])

    def window(self, positions: np.ndarray) -> np.ndarray:
        """Tokens at global `positions` (any shape); _NONE outside the live window."""
        live = (positions >= self.start) & (positions < self.end)
        return np.where(live, self.ring[positions % self.capacity], _NONE)


@dataclass
class _Candidates:
    """Earlier occurrences of the context's last token: the tokens after each (rows, _END or
    _NONE past their end), each row's weight, and which rows came from the cache."""

    following: np.ndarray  # (n, width) int64
    weights: np.ndarray  # (n,) float64
    cached: np.ndarray  # (n,) bool

    def __len__(self) -> int:
        return len(self.weights)


class SuffixDrafter:
    def __init__(self, config: SuffixConfig = SuffixConfig()):
        self.config = config
        self.cache = SuffixCache(config.max_cached_tokens)
        self.stats = SuffixStats()
        self.last = "none"  # where the last proposal mostly came from: "context", "cache" or "none"

    def learn(self, completion: Sequence[int]) -> None:
        """Remember a finished request's completion (its output tokens, prompt excluded)."""
        if len(completion) >= 2:
            self.stats.learned += 1
            self.stats.evicted_tokens += self.cache.add(completion)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens: the best-scored path while its score stays at least min_token_prob."""
        candidates = self._candidates(tokens, k)
        if candidates is None:
            return []
        c = self.config
        rows, weights = candidates.following, candidates.weights
        total = weights.sum() + c.evidence_prior
        draft: list[int] = []
        first: np.ndarray | None = None  # the rows agreeing with the first drafted token
        for step in range(rows.shape[1]):
            column = rows[:, step]
            token, weight = _heaviest(column, weights)
            if token is None or weight / total < c.min_token_prob:
                break
            draft.append(token)
            agree = column == token
            if step == 0:
                first = agree  # rows are still every candidate
            rows, weights = rows[agree], weights[agree]
        self._account(candidates, first)
        return draft

    def propose_tree(self, tokens: Sequence[int], nodes: int) -> tuple[list[int], list[int]]:
        """A token tree of up to `nodes` nodes (tokens, parent indices; `specdec.core.tree`): the
        candidates' continuations expanded best first by path score, so where they disagree
        several branches are drafted at once (the paper's speculation tree). A child scores at
        most its parent, so parents are taken first."""
        candidates = self._candidates(tokens, nodes)
        if candidates is None:
            return [], []
        c = self.config
        total = candidates.weights.sum() + c.evidence_prior
        tokens_out: list[int] = []
        parents: list[int] = []
        frontier: list[tuple[float, int, int, int, np.ndarray, int]] = []  # (-score, order, token, parent, rows, depth)
        order = 0

        def expand(rows: np.ndarray, depth: int, parent: int) -> None:
            nonlocal order
            if depth >= candidates.following.shape[1]:
                return
            column = candidates.following[rows, depth]
            values, sums = _weight_by_token(column, candidates.weights[rows])
            for token, weight in zip(values.tolist(), sums.tolist()):
                if weight / total >= c.min_token_prob:
                    heapq.heappush(frontier, (-weight / total, order, token, parent, rows[column == token], depth + 1))
                    order += 1

        expand(np.arange(len(candidates)), 0, -1)
        first: np.ndarray | None = None
        while frontier and len(tokens_out) < nodes:
            _, _, token, parent, rows, depth = heapq.heappop(frontier)
            if not tokens_out:
                first = np.zeros(len(candidates), dtype=bool)
                first[rows] = True
            tokens_out.append(token)
            parents.append(parent)
            expand(rows, depth, len(tokens_out) - 1)
        self._account(candidates, first)
        return tokens_out, parents

    def _account(self, candidates: _Candidates, first: np.ndarray | None) -> None:
        """Stats: a proposal comes from the source holding most of its first token's weight."""
        if first is None or not first.any():
            return
        weights = candidates.weights[first]
        cached = candidates.cached[first]
        if weights[cached].sum() > weights[~cached].sum():
            self.stats.from_cache += 1
            self.last = "cache"
        else:
            self.stats.from_context += 1
            self.last = "context"

    def _candidates(self, tokens: Sequence[int], k: int) -> _Candidates | None:
        """Every source's candidates for a draft of up to k tokens, or None when there are none."""
        self.stats.lookups += 1
        self.last = "none"
        if k <= 0 or len(tokens) < 2:
            return None
        context = np.asarray(tokens, dtype=np.int64)
        reversed_suffix = context[::-1][: self.config.max_match]
        width = min(k, self.config.max_match)
        own = self._in_context(context, reversed_suffix, width)
        cached = self._in_cache(context, reversed_suffix, width)
        # The cache's rows first: ties go to the latest row, the request's own text.
        found = [part for part in (cached, own) if part is not None]
        if not found:
            return None
        return _Candidates(
            np.concatenate([part.following for part in found]),
            np.concatenate([part.weights for part in found]),
            np.concatenate([part.cached for part in found]),
        )

    def _in_context(self, context: np.ndarray, reversed_suffix: np.ndarray, width: int) -> _Candidates | None:
        # Every earlier position whose token is the context's last one and which is followed by a
        # token (so the suffix never matches itself).
        ends = np.flatnonzero(context[:-1] == context[-1])

        def token_at(at: np.ndarray) -> np.ndarray:
            return np.where(at >= 0, context[np.maximum(at, 0)], _NONE)

        ends = self._narrow(ends, token_at, reversed_suffix)
        if len(ends) == 0:
            return None
        at = ends[:, None] + 1 + np.arange(width)[None, :]
        following = np.where(at < len(context), context[np.minimum(at, len(context) - 1)], _END)
        return self._weighed(ends, token_at, reversed_suffix, following, cached=False)

    def _in_cache(self, context: np.ndarray, reversed_suffix: np.ndarray, width: int) -> _Candidates | None:
        positions = self.cache.index.get(int(context[-1]))
        if not positions:
            return None
        count = min(len(positions), _MAX_SCANNED)
        ends = np.fromiter((positions[-1 - i] for i in range(count)), dtype=np.int64, count=count)[::-1]
        ends = self._narrow(ends, self.cache.window, reversed_suffix)
        following = self.cache.window(ends[:, None] + 1 + np.arange(width)[None, :])
        return self._weighed(ends, self.cache.window, reversed_suffix, following, cached=True)

    def _narrow(self, ends: np.ndarray, token_at, reversed_suffix: np.ndarray) -> np.ndarray:
        """The most recent max_candidates of `ends`, after keeping, while more than that remain,
        only those matching one more token of the suffix."""
        step = 1
        while len(ends) > self.config.max_candidates and step < len(reversed_suffix):
            narrower = ends[token_at(ends - step) == reversed_suffix[step]]
            if len(narrower) == 0:
                break
            ends, step = narrower, step + 1
        return ends[-self.config.max_candidates :]

    def _weighed(self, ends, token_at, reversed_suffix, following, *, cached: bool) -> _Candidates:
        """Candidates ending at `ends`, each weighing its match length to the power match_power."""
        earlier = token_at(ends[:, None] - np.arange(len(reversed_suffix))[None, :])
        matched = (earlier == reversed_suffix[None, :]).cumprod(axis=1).sum(axis=1)
        weights = matched.astype(np.float64) ** self.config.match_power
        return _Candidates(following, weights, np.full(len(ends), cached))


def _weight_by_token(column: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tokens in `column` (_END and _NONE left out: those candidates have no more tokens) and
    the weight of the rows holding each."""
    valid = column >= 0
    values, inverse = np.unique(column[valid], return_inverse=True)
    return values, np.bincount(inverse, weights=weights[valid], minlength=len(values))


def _heaviest(column: np.ndarray, weights: np.ndarray) -> tuple[int | None, float]:
    """The token with the most weight in `column` (ties: the latest row's), and that weight."""
    values, sums = _weight_by_token(column, weights)
    if len(values) == 0:
        return None, 0.0
    best = sums.max()
    tied = set(values[sums == best].tolist())
    token = next(int(t) for t in column[::-1] if int(t) in tied)
    return token, float(best)
