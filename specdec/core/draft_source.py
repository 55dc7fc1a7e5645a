"""Which drafter answered a round, on both sides of the wire, and what a draft model may draft.

The engine prices prompt lookups (nearly free, often right) and draft-model tokens (a model step
each, right less often) apart (coordinator/adaptive.py), so every proposal names its source.
"""

from __future__ import annotations

from enum import StrEnum

from specdec.v1 import draft_pb2


class DraftSource(StrEnum):
    """`DraftProposal.source`; the values are also the draft tier's Prometheus label values."""

    UNKNOWN = ""  # not reported (an older replica): priced as a model
    NGRAM = "ngram"  # prompt lookup: a match of at least the drafter's minimum length
    NGRAM_SHORT = "ngram_short"  # a hybrid's shorter match, tried before its model
    MODEL = "model"  # the draft model
    SUFFIX = "suffix"  # suffix decoding: the context's or earlier completions' continuation


_TO_PROTO = {
    DraftSource.UNKNOWN: draft_pb2.DRAFT_SOURCE_UNSPECIFIED,
    DraftSource.NGRAM: draft_pb2.DRAFT_SOURCE_NGRAM,
    DraftSource.NGRAM_SHORT: draft_pb2.DRAFT_SOURCE_NGRAM_SHORT,
    DraftSource.MODEL: draft_pb2.DRAFT_SOURCE_MODEL,
    DraftSource.SUFFIX: draft_pb2.DRAFT_SOURCE_SUFFIX,
}
_FROM_PROTO = {wire: source for source, wire in _TO_PROTO.items()}


def to_proto(source: str) -> int:
    """`ProposeResponse.source` for a proposal's source (an unknown name: unspecified)."""
    return _TO_PROTO.get(source, draft_pb2.DRAFT_SOURCE_UNSPECIFIED)


def from_proto(value: int) -> DraftSource:
    """A proposal's source from `ProposeResponse.source` (a value this side does not know: unknown)."""
    return _FROM_PROTO.get(value, DraftSource.UNKNOWN)


def is_lookup(source: str) -> bool:
    """Lookups (prompt or suffix) are nearly free; any other source, unknown included, is priced as a model."""
    return source in (DraftSource.NGRAM, DraftSource.NGRAM_SHORT, DraftSource.SUFFIX)


def model_draft_limit(k: int, model_k: int | None) -> int:
    """The most tokens a draft model may propose in a round of k drafts capped at model_k
    (`ProposeRequest.model_draft_tokens`; None: no cap)."""
    return k if model_k is None else min(k, model_k)
