"""In-process adapters: the Proposer and Verifier interfaces over the pure drafters and verifier.

Tests and `specdec generate --in-process` run the engine through these; the remote clients
implement the same two interfaces, so production runs the code the equality tests run. Model
calls go to a worker thread (torch releases the GIL) and a lock keeps one call per model at a
time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from specdec.coordinator.engine import EngineConfig, SpeculativeEngine
from specdec.core.acceptance import DraftProposal, Verification
from specdec.core.draft_source import model_draft_limit
from specdec.core.sampling import SamplingParams
from specdec.draft_service.hybrid import HybridDrafter, parse_spec
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.ngram import NgramDrafter
from specdec.draft_service.suffix import SuffixDrafter
from specdec.drafts import loading as draft_loading
from specdec.runtime.loading import load_model
from specdec.runtime.models import LoadedModel
from specdec.target_service.verifier import TargetVerifier


class _Serialized:
    def __init__(self):
        self._lock = threading.Lock()

    async def _call(self, fn, *args):
        def locked():
            with self._lock:
                return fn(*args)

        return await asyncio.to_thread(locked)


class LocalModelProposer(_Serialized):
    def __init__(self, drafter: ModelDrafter | HybridDrafter):
        super().__init__()
        self.drafter = drafter

    async def propose(
        self,
        session_id: str,
        tokens: Sequence[int],
        k: int,
        sampling: SamplingParams,
        model_k: int | None = None,
        affinity: str = "",  # one process, one replica: nothing to place
        tree: bool = False,  # a model (or a hybrid) drafts chains
    ) -> DraftProposal:
        if isinstance(self.drafter, HybridDrafter):
            return await self._call(self.drafter.propose, session_id, tokens, k, sampling, model_k)
        k = model_draft_limit(k, model_k)
        return (
            await self._call(self.drafter.propose, session_id, tokens, k, sampling)
            if k > 0
            else DraftProposal([], source="model")
        )

    async def end_session(self, session_id: str, completion: Sequence[int] = ()) -> None:
        if isinstance(self.drafter, HybridDrafter):
            await self._call(self.drafter.end_session, session_id, completion)
        else:
            await self._call(self.drafter.end_session, session_id)


class LocalNgramProposer:
    """No model: runs inline, it costs microseconds (a suffix drafter learns each completion)."""

    def __init__(self, drafter: NgramDrafter | SuffixDrafter | None = None):
        self.drafter = drafter or NgramDrafter()
        self.source = "suffix" if isinstance(self.drafter, SuffixDrafter) else "ngram"

    async def propose(
        self,
        session_id: str,
        tokens: Sequence[int],
        k: int,
        sampling: SamplingParams,
        model_k: int | None = None,  # no model: lookups only
        affinity: str = "",  # one process, one replica: nothing to place
        tree: bool = False,
    ) -> DraftProposal:
        if tree and isinstance(self.drafter, SuffixDrafter):
            ids, parents = self.drafter.propose_tree(tokens, k)
            return DraftProposal(ids, source=self.source, parents=parents)
        return DraftProposal(self.drafter.propose(tokens, k), source=self.source)

    async def end_session(self, session_id: str, completion: Sequence[int] = ()) -> None:
        if isinstance(self.drafter, SuffixDrafter):
            self.drafter.learn(completion)


class LocalVerifier(_Serialized):
    def __init__(self, verifier: TargetVerifier):
        super().__init__()
        self.verifier = verifier

    async def verify(
        self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams
    ) -> Verification:
        return await self._call(self.verifier.verify, session_id, tokens, proposal, sampling)

    async def end_session(self, session_id: str) -> None:
        await self._call(self.verifier.end_session, session_id)


def build_engine(
    target: LoadedModel,
    draft: LoadedModel | None,
    config: EngineConfig = EngineConfig(),
    *,
    hybrid: bool = False,
    suffix: bool = False,
    min_confidence: float | None = None,
    compile_mode: str = "off",
) -> SpeculativeEngine:
    """The single-process engine; `draft` None means the n-gram drafter, `hybrid` prompt lookup
    where the context repeats and the draft model elsewhere (draft_service/hybrid.py); `suffix`
    suffix decoding instead of n-gram lookup (draft_service/suffix.py), alone or in the hybrid;
    `min_confidence` as the draft service's (None: the draft's own); `compile_mode` as the
    target tier's `--compile`."""
    lookup = SuffixDrafter() if suffix else None
    if draft is None:
        proposer = LocalNgramProposer(lookup)
    else:
        drafter = ModelDrafter(draft, min_confidence=min_confidence)
        proposer = LocalModelProposer(HybridDrafter(drafter, suffix=lookup) if hybrid else drafter)
    verifier = TargetVerifier(target, compile_mode=compile_mode)
    engine = SpeculativeEngine(proposer, LocalVerifier(verifier), target, config)
    engine.costs.seed_passes(verifier.profile_passes())
    return engine


def load_pair(target_model: str | None, draft_model: str | None) -> tuple[LoadedModel, LoadedModel | None]:
    """Load the models the flags name: target None is the embedded default, draft "ngram" (or
    None) is the model-free drafter, "hybrid:SPEC" loads SPEC (pass hybrid=True to build_engine).
    The target loads through the runtime loader alone; only the draft knows the draft formats."""
    target = load_model(target_model)
    if draft_model in (None, "ngram", "suffix"):
        return target, None
    return target, draft_loading.load_model(parse_spec(draft_model) or draft_model)
