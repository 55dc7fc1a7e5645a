"""Hybrid drafting: prompt lookup where the context repeats itself, the draft model elsewhere.

When the context's last `min_match` tokens occurred before, the tokens that followed that
occurrence are a better guess than a small model's (copies in code edits, quotes, RAG answers),
and they cost microseconds instead of k model steps. Elsewhere the model drafts, and where it
declines (a greedy draft stops at the model's first unsure token) a shorter match answers: on the
free-continuation prompts the n-gram drafter's 1- and 2-token matches carry it to 1.1-1.25x
target-only, better than the shipped draft does there. The choice is made per round.

Mixing is exact: the acceptance rule judges each round on its own. An n-gram round is a point
mass (draft_probs None: accept iff the target's own keyed draw equals the draft), a model round
carries its q; both leave each output token distributed as the target's, so a request may switch
between them from one round to the next. Greedy rounds compare argmaxes either way.

The model's KV cache simply skips n-gram rounds: its next call finds the common prefix with the
context (`specdec.kv_cache.resume`) and feeds the tokens committed meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from draft_service.model_drafter import ModelDrafter, ProposeItem
from draft_service.ngram import NgramConfig, NgramDrafter
from specdec.acceptance import DraftProposal
from specdec.sampling import SamplingParams

PREFIX = "hybrid:"  # --draft-model hybrid:SPEC serves SPEC with n-gram rounds where they match


@dataclass(frozen=True)
class HybridConfig:
    min_match: int = 3  # shortest context suffix whose earlier occurrence is trusted over the model
    max_match: int = 6  # longest suffix tried first (longer matches predict better)


def model_k(item: ProposeItem) -> int:
    """The tokens the model may draft for `item`: its k, capped by its model_k when set."""
    return item.k if item.model_k is None else min(item.k, item.model_k)


def parse_spec(spec: str) -> str | None:
    """The model spec inside 'hybrid:SPEC', or None when `spec` is not a hybrid spec."""
    return spec[len(PREFIX) :] if spec.startswith(PREFIX) else None


class HybridDrafter:
    """Same interface as ModelDrafter (propose, propose_batch, end_session)."""

    def __init__(self, model: ModelDrafter, config: HybridConfig = HybridConfig()):
        if not 1 <= config.min_match <= config.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {config}")
        self.model = model
        self.config = config
        self.ngram = NgramDrafter(NgramConfig(max_ngram=config.max_match, min_ngram=config.min_match))
        # Matches shorter than min_match still predict better than nothing: they answer the rounds
        # the model declines (greedy drafts stop at the model's first unsure token, model_drafter.py).
        self.short = NgramDrafter(NgramConfig(max_ngram=config.min_match - 1, min_ngram=1)) if config.min_match > 1 else None
        self.ngram_rounds = 0  # rounds answered by prompt lookup (a match of at least min_match)
        self.model_rounds = 0  # rounds without a long match: the model's (unless capped at 0), or a short match's
        self.short_rounds = 0  # of those, rounds the model declined and a shorter match answered

    def choose(self, tokens: Sequence[int], k: int) -> list[int]:
        """This round's choice: the n-gram proposal when the context has a match of at least
        min_match tokens, else [] (the model drafts). Counted either way; the draft service calls
        it directly (its n-gram rounds need no model queue), propose_batch in process."""
        ids = self.ngram.propose(tokens, k)
        if ids:
            self.ngram_rounds += 1
        else:
            self.model_rounds += 1
        return ids

    def fallback(self, tokens: Sequence[int], k: int, proposal: DraftProposal) -> DraftProposal:
        """`proposal` itself, unless the model proposed nothing and a shorter match does."""
        if proposal.token_ids or self.short is None or k <= 0:
            return proposal
        ids = self.short.propose(tokens, k)
        self.short_rounds += bool(ids)
        return DraftProposal(ids, source="ngram_short") if ids else proposal  # point masses: no q

    def propose(self, session_id: str, tokens: Sequence[int], k: int, sampling: SamplingParams, model_k: int | None = None) -> DraftProposal:
        return self.propose_batch([ProposeItem(session_id, tokens, k, sampling, model_k)])[0]

    def propose_batch(self, items: Sequence[ProposeItem]) -> list[DraftProposal]:
        """n-gram proposals where a match exists; one batched model step for all the others
        (each capped at its item's model_k: at 0 the model is skipped and only a shorter match
        may answer)."""
        proposals: list[DraftProposal | None] = [None] * len(items)
        for i, item in enumerate(items):
            if ids := self.choose(item.tokens, item.k):
                proposals[i] = DraftProposal(ids, source="ngram")  # point masses: no q
        rest = [i for i, p in enumerate(proposals) if p is None]
        capped = [replace(items[i], k=model_k(items[i]), model_k=None) for i in rest]
        asked = [j for j, item in enumerate(capped) if item.k > 0]
        drafted = dict(zip(asked, self.model.propose_batch([capped[j] for j in asked]) if asked else []))
        for j, i in enumerate(rest):
            proposals[i] = self.fallback(items[i].tokens, items[i].k, drafted.get(j, DraftProposal([], source="model")))
        return proposals  # type: ignore[return-value]

    def end_session(self, session_id: str) -> None:
        self.model.end_session(session_id)
