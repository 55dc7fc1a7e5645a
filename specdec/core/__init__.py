"""The pure core: the acceptance rule, warping and keyed randomness, q on the wire, draft
sources, errors and the session store. It imports torch and protobuf only: the math is testable
with no network and no model."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "DraftProposal": "acceptance",
    "Verification": "acceptance",
    "verify_greedy": "acceptance",
    "verify_sampled": "acceptance",
    "SamplingParams": "sampling",
    "warp": "sampling",
    "InvalidArgument": "errors",
    "SessionStore": "session_store",
    "DraftSource": "draft_source",
    "model_draft_limit": "draft_source",
    "pack_probs": "packing",
    "unpack_probs": "packing",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
