"""The drafters behind the `Drafter` contract, and the one place that picks which a configuration names.

Each class here adapts one drafting algorithm (ngram.py, suffix.py, model_drafter.py, hybrid.py)
to the contract without changing it; `build_drafter` maps a configuration to one of them and
`draft_model` names the model a `--draft-model` spec loads. Nothing else branches on kinds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from specdec.core.acceptance import DraftProposal
from specdec.core.draft_source import model_draft_limit
from specdec.draft_service.drafter import Capabilities, Drafted, Drafter, DraftRequest, Learned, ModelStep
from specdec.draft_service.hybrid import HybridConfig, HybridDrafter, parse_spec
from specdec.draft_service.ngram import NgramDrafter
from specdec.draft_service.suffix import SuffixConfig, SuffixDrafter

if TYPE_CHECKING:  # transformers takes seconds to import; an n-gram replica never needs it
    from specdec.draft_service.model_drafter import ModelDrafter

LOOKUPS = ("ngram", "suffix")  # the --draft-model specs that load no model


def draft_model(spec: str | None) -> str | None:
    """The draft model a spec loads: SPEC of 'hybrid:SPEC' or 'suffix:SPEC', a bare SPEC itself,
    None for the lookups alone ('ngram', 'suffix', or no spec)."""
    if spec is None or spec in LOOKUPS:
        return None
    return parse_spec(spec) or spec


def build_drafter(
    model: ModelDrafter | None,
    step: ModelStep | None = None,
    *,
    hybrid: HybridConfig | None = None,
    suffix: SuffixConfig | None = None,
) -> Drafter:
    """The drafter a configuration names: without a model, n-gram lookup (suffix decoding with
    `suffix`); with one, the model alone, or with `hybrid` lookups first (suffix decoding's with
    `suffix`). `step` runs the model's batched step (None: one call at a time in a thread)."""
    lookup = None if suffix is None else SuffixDrafter(suffix)
    if model is None:
        return NgramDrafting() if lookup is None else SuffixDrafting(lookup)
    if hybrid is None:
        return ModelDrafting(model, step)
    return HybridDrafting(HybridDrafter(model, hybrid, suffix=lookup), step)


def in_thread(model: ModelDrafter) -> ModelStep:
    """The model's step in a worker thread (torch releases the GIL), one call at a time."""
    lock = threading.Lock()

    def one(request: DraftRequest) -> DraftProposal:
        with lock:
            return model.propose_batch([request])[0]

    async def step(request: DraftRequest) -> DraftProposal:
        return await asyncio.to_thread(one, request)

    return step


class NgramDrafting:
    """Prompt lookup: point masses (no q), answered at once."""

    capabilities = Capabilities()

    def __init__(self, ngram: NgramDrafter | None = None):
        self.ngram = ngram or NgramDrafter()

    async def propose(self, request: DraftRequest) -> Drafted:
        return Drafted(DraftProposal(self.ngram.propose(request.tokens, request.k), source="ngram"))

    def observe(self, session_id: str, completion: Sequence[int]) -> Learned | None:
        return None

    def end(self, session_id: str) -> None:
        pass


class SuffixDrafting:
    """Suffix decoding: chains or token trees of point masses, learned from every completion."""

    capabilities = Capabilities(trees=True, learns=True)

    def __init__(self, suffix: SuffixDrafter | None = None):
        self.suffix = suffix or SuffixDrafter()

    async def propose(self, request: DraftRequest) -> Drafted:
        if request.tree:
            ids, parents = self.suffix.propose_tree(request.tokens, request.k)
            return Drafted(DraftProposal(ids, source="suffix", parents=parents), self.suffix.last)
        return Drafted(DraftProposal(self.suffix.propose(request.tokens, request.k), source="suffix"), self.suffix.last)

    def observe(self, session_id: str, completion: Sequence[int]) -> Learned | None:
        return _learn(self.suffix, completion)

    def end(self, session_id: str) -> None:
        pass


class ModelDrafting:
    """A draft model: every round is its step's, capped at the request's model_k (at 0: no draft)."""

    capabilities = Capabilities(draft_probs=True, model=True)

    def __init__(self, model: ModelDrafter, step: ModelStep | None = None):
        self.model = model
        self.step = step or in_thread(model)

    async def propose(self, request: DraftRequest) -> Drafted:
        k = model_draft_limit(request.k, request.model_k)
        if k <= 0:
            return Drafted(DraftProposal([], source="model"))
        return Drafted(await self.step(replace(request, k=k, model_k=None)))

    def observe(self, session_id: str, completion: Sequence[int]) -> Learned | None:
        return None

    def end(self, session_id: str) -> None:
        self.model.end_session(session_id)


class HybridDrafting:
    """Lookup rounds where they match, answered at once (they need no model, so no queue); the
    model's step elsewhere. With a suffix lookup it learns from every completion."""

    def __init__(self, hybrid: HybridDrafter, step: ModelStep | None = None):
        self.hybrid = hybrid
        self.model = ModelDrafting(hybrid.model, step)
        self.capabilities = Capabilities(draft_probs=True, model=True, learns=hybrid.suffix is not None)

    async def propose(self, request: DraftRequest) -> Drafted:
        suffix = self.hybrid.suffix
        lookups = None if suffix is None else suffix.stats.lookups
        looked_up = self.hybrid.choose(request.tokens, request.k)
        found_in = suffix.last if suffix is not None and suffix.stats.lookups != lookups else ""
        if looked_up is not None:
            return Drafted(looked_up, found_in)
        return Drafted((await self.model.propose(request)).proposal, found_in)

    def observe(self, session_id: str, completion: Sequence[int]) -> Learned | None:
        return None if self.hybrid.suffix is None else _learn(self.hybrid.suffix, completion)

    def end(self, session_id: str) -> None:
        self.model.end(session_id)


def _learn(suffix: SuffixDrafter, completion: Sequence[int]) -> Learned:
    suffix.learn(completion)
    return Learned(suffix.cache.tokens, suffix.cache.nbytes())
