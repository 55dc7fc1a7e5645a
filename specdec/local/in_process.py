"""In-process adapters: the Proposer and Verifier interfaces over a drafter and the pure verifier.

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
from specdec.core.sampling import SamplingParams
from specdec.draft_service.drafter import Drafter, DraftRequest
from specdec.draft_service.hybrid import HybridConfig
from specdec.draft_service.model_drafter import ModelDrafter
from specdec.draft_service.registry import build_drafter, draft_model
from specdec.draft_service.suffix import SuffixConfig
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


class LocalProposer:
    """The Proposer interface over one drafter (the `Drafter` contract, draft_service/drafter.py):
    lookups answer inline, a draft model's rounds run in a worker thread, one at a time."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter

    async def propose(
        self,
        session_id: str,
        tokens: Sequence[int],
        k: int,
        sampling: SamplingParams,
        model_k: int | None = None,
        affinity: str = "",  # one process, one replica: nothing to place
        tree: bool = False,
    ) -> DraftProposal:
        drafted = await self.drafter.propose(DraftRequest(session_id, tokens, k, sampling, model_k, tree))
        return drafted.proposal

    async def end_session(self, session_id: str, completion: Sequence[int] = ()) -> None:
        self.drafter.observe(session_id, completion)
        self.drafter.end(session_id)


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
    model = None if draft is None else ModelDrafter(draft, min_confidence=min_confidence)
    drafter = build_drafter(model, hybrid=HybridConfig() if hybrid else None, suffix=SuffixConfig() if suffix else None)
    verifier = TargetVerifier(target, compile_mode=compile_mode)
    engine = SpeculativeEngine(LocalProposer(drafter), LocalVerifier(verifier), target, config)
    engine.costs.seed_passes(verifier.profile_passes())
    return engine


def load_pair(target_model: str | None, spec: str | None) -> tuple[LoadedModel, LoadedModel | None]:
    """Load the models the flags name: target None is the embedded default, draft "ngram" (or
    None) is the model-free drafter, "hybrid:SPEC" loads SPEC (pass hybrid=True to build_engine).
    The target loads through the runtime loader alone; only the draft knows the draft formats."""
    target = load_model(target_model)
    name = draft_model(spec)
    return target, None if name is None else draft_loading.load_model(name)
