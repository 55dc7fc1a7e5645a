"""Hybrid drafting: prompt lookup where the context repeats itself, the draft model elsewhere.

When the context's last `min_match` tokens occurred before, the tokens that followed that
occurrence are a better guess than a small model's (copies in code edits, quotes, RAG answers),
and they cost microseconds instead of k model steps. A shorter match (1 to min_match - 1 tokens)
comes next, and the model drafts only where the context's last token never occurred before: a
short match costs nothing and its first token is the target's at least as often as the shipped
draft's on free continuation (bench/results/history/bench-readme-figures.md, "Hybrid order").
The choice is made per round.

Mixing is exact: the acceptance rule judges each round on its own. A lookup round is a point
mass (draft_probs None: accept iff the target's own keyed draw equals the draft), a model round
carries its q; both leave each output token distributed as the target's, so a request may switch
between them from one round to the next. Greedy rounds compare argmaxes either way.

With a suffix drafter (`suffix:SPEC`, draft_service/suffix.py) the lookup is suffix decoding
over the context and earlier requests' completions, any match length, before the model.

The model's KV simply skips lookup rounds: its next call finds the common prefix with the
context (`ModelDrafter._resume`) and feeds the tokens committed meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specdec.core.acceptance import DraftProposal
from specdec.core.draft_source import model_draft_limit
from specdec.core.sampling import SamplingParams
from specdec.draft_service.drafter import DraftRequest
from specdec.draft_service.ngram import NgramConfig, NgramDrafter
from specdec.draft_service.suffix import SuffixDrafter

if TYPE_CHECKING:  # transformers takes seconds to import; the spec parsing here needs none of it
    from specdec.draft_service.model_drafter import ModelDrafter

PREFIX = "hybrid:"  # --draft-model hybrid:SPEC serves SPEC with n-gram rounds where they match
SUFFIX_PREFIX = "suffix:"  # --draft-model suffix:SPEC: suffix-decoding rounds where they match, SPEC elsewhere


@dataclass(frozen=True)
class HybridConfig:
    min_match: int = 3  # a long match (source "ngram"); shorter ones answer as "ngram_short", still before the model
    max_match: int = 6  # longest suffix tried first (longer matches predict better)


def model_k(item: DraftRequest) -> int:
    """The tokens the model may draft for `item`: its k, capped by its model_k when set."""
    return model_draft_limit(item.k, item.model_k)


def parse_spec(spec: str) -> str | None:
    """The model spec inside 'hybrid:SPEC' or 'suffix:SPEC', or None when `spec` is neither."""
    for prefix in (PREFIX, SUFFIX_PREFIX):
        if spec.startswith(prefix):
            return spec[len(prefix) :]
    return None


def uses_suffix(spec: str | None) -> bool:
    """Whether a drafter spec drafts by suffix decoding ('suffix' alone, or 'suffix:SPEC')."""
    return spec is not None and (spec == "suffix" or spec.startswith(SUFFIX_PREFIX))


class HybridDrafter:
    """Same drafting interface as ModelDrafter (propose, propose_batch); `HybridDrafting`
    (registry.py) puts it behind the `Drafter` contract."""

    def __init__(self, model: ModelDrafter, config: HybridConfig = HybridConfig(), suffix: SuffixDrafter | None = None):
        if not 1 <= config.min_match <= config.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {config}")
        self.model = model
        self.config = config
        self.suffix = suffix  # when set, the lookup (min_match does not apply: its own config does)
        self.ngram = NgramDrafter(NgramConfig(max_ngram=config.max_match, min_ngram=config.min_match))
        self.short = (
            NgramDrafter(NgramConfig(max_ngram=config.min_match - 1, min_ngram=1)) if config.min_match > 1 else None
        )
        self.suffix_rounds = 0  # rounds answered by the suffix drafter
        self.ngram_rounds = 0  # rounds answered by a match of at least min_match tokens
        self.short_rounds = 0  # rounds answered by a shorter match
        self.model_rounds = 0  # rounds without any match: the model's (unless capped at 0 or it declined)

    def choose(self, tokens: Sequence[int], k: int) -> DraftProposal | None:
        """This round's lookup: a match of at least min_match tokens ("ngram"), else a shorter
        one ("ngram_short"), else None (the model drafts). Counted either way; `HybridDrafting`
        calls it directly (lookups need no model queue), propose_batch too. With a suffix
        drafter, its draft ("suffix") else None."""
        if self.suffix is not None:
            if k > 0 and (ids := self.suffix.propose(tokens, k)):
                self.suffix_rounds += 1
                return DraftProposal(ids, source="suffix")
            self.model_rounds += 1
            return None
        if k > 0 and (ids := self.ngram.propose(tokens, k)):
            self.ngram_rounds += 1
            return DraftProposal(ids, source="ngram")  # point masses: no q
        if k > 0 and self.short is not None and (ids := self.short.propose(tokens, k)):
            self.short_rounds += 1
            return DraftProposal(ids, source="ngram_short")
        self.model_rounds += 1
        return None

    def propose(
        self, session_id: str, tokens: Sequence[int], k: int, sampling: SamplingParams, model_k: int | None = None
    ) -> DraftProposal:
        return self.propose_batch([DraftRequest(session_id, tokens, k, sampling, model_k)])[0]

    def propose_batch(self, items: Sequence[DraftRequest]) -> list[DraftProposal]:
        """Lookups where a match exists; one batched model step for all the others (each capped at
        its item's model_k: at 0 the model is skipped and the round has no draft)."""
        proposals = [self.choose(item.tokens, item.k) for item in items]
        asked = [i for i, p in enumerate(proposals) if p is None and model_k(items[i]) > 0]
        drafted = (
            self.model.propose_batch([replace(items[i], k=model_k(items[i]), model_k=None) for i in asked])
            if asked
            else []
        )
        for i, proposal in zip(asked, drafted):
            proposals[i] = proposal
        return [p if p is not None else DraftProposal([], source="model") for p in proposals]
