"""The engine over the remote tiers: what `specdec coordinator` serves.

`connect_engine` builds it from the draft client, the target pool and a `TargetInfo` made of the
target's tokenizer (no weights: the coordinator never runs the model) and what the pool reports
(vocabulary, context, EOS ids).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from opentelemetry import trace
from transformers import PreTrainedTokenizerBase

from specdec.coordinator.clients import DraftClient
from specdec.coordinator.engine import EngineConfig, SpeculativeEngine
from specdec.core.settings import AUTO
from specdec.runtime.loading import load_tokenizer
from specdec.runtime.models import EMBEDDED_NAME
from specdec.target_service.pool import TargetPool


@dataclass(frozen=True)
class RemoteTarget:
    """The engine's `TargetInfo` for a target model held by the pool, not by this process."""

    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: frozenset[int]
    vocab_size: int
    max_context: int
    name: str  # the model as the pool names it


async def connect_engine(
    draft: DraftClient,
    pool: TargetPool,
    target_model: str | None = None,
    config: EngineConfig = EngineConfig(),
    tracer: trace.Tracer | None = None,
) -> SpeculativeEngine:
    """The engine over both tiers. The tokenizer is loaded from `target_model`, or by default
    from the model the pool reports (the same spec names the same files on every machine of a
    deployment built from one image)."""
    info = await pool.info()
    if target_model is None and info["model"] != EMBEDDED_NAME:
        target_model = info["model"]
    tokenizer = await asyncio.to_thread(load_tokenizer, target_model)
    target = RemoteTarget(
        tokenizer, frozenset(info["eos_token_ids"]), info["vocab_size"], info["max_context"], info["model"]
    )
    if config.speculation_token_budget == AUTO:
        # No fixed budget on any device: the draft-length policy prices a round's drafts by the
        # pass they would make for all its rounds, from the passes the target reports.
        config = replace(config, speculation_token_budget=0)
    engine = SpeculativeEngine(draft, pool, target, config, tracer)
    engine.costs.seed_passes(info.get("pass_seconds") or {})
    engine.costs.plain_ahead = bool(info.get("lookahead"))
    return engine
