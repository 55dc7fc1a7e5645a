"""The distilled draft shipped for the embedded target, and what the default drafter is.

`specdec distill-draft` wrote it (specdec/drafts/gemma3-270m/: draft.json, vocab.json and the
draft's own two layers in bf16, 22 MB; its embedding and output rows are the target's, taken at
load time). The model spec "distilled" names it anywhere a model is named (`--draft-model
distilled`, `--draft-model hybrid:distilled`).

"auto", the default of `specdec up`, `specdec demo` and `specdec generate --in-process`, is
`hybrid:distilled` for the embedded target (prompt lookup where the context repeats, this draft
where it never does) and the n-gram drafter for any other target (a draft must share its
target's tokenizer). The hybrid is the default because, with oneDNN's packed kernels for its
verify passes (specdec/runtime/projection.py), it ties the n-gram drafter on copies and short
requests and leads it on free continuation (1.58-1.62x target-only against 1.57-1.59x, 2 cores).
"""

from __future__ import annotations

from pathlib import Path

DISTILLED = "distilled"  # model spec of the shipped draft
AUTO = "auto"  # drafter spec: the best drafter shipped for the target
DIRECTORY = Path(__file__).parent / "gemma3-270m"
AUTO_DRAFTER = "hybrid:distilled"  # what "auto" is for the embedded target (see above)


def resolve_model(spec: str | None) -> str | None:
    """A model spec with "distilled" replaced by the shipped draft's directory."""
    return str(DIRECTORY) if spec == DISTILLED else spec


def available() -> bool:
    return (DIRECTORY / "draft.json").is_file()


def resolve_drafter(draft_spec: str | None, target_spec: str | None) -> str:
    """The drafter a --draft-model value means: "auto" (or None) is AUTO_DRAFTER for the embedded
    target when the draft is shipped, else "ngram" (a draft must share its target's tokenizer);
    any other value is kept."""
    if draft_spec not in (None, AUTO):
        return draft_spec
    embedded = target_spec in (None, "default")
    return AUTO_DRAFTER if embedded and available() else "ngram"
