"""The distilled draft shipped for the embedded target, and what the default drafter is.

`specdec distill-draft` wrote it (specdec/drafts/gemma3-270m/: draft.json, vocab.json and the
draft's own two layers in bf16, 22 MB; its embedding and output rows are the target's, taken at
load time). The model spec "distilled" names it anywhere a model is named (`--draft-model
distilled`, `--draft-model hybrid:distilled`).

"auto", the default of `specdec up`, `specdec demo` and `specdec generate --in-process`, is the
n-gram drafter for now, for every target: measured side by side (`specdec bench`, 2026-11-30,
2 CPU cores), hybrid:distilled ran at 0.80-0.91x the n-gram drafter's tokens/s on free
continuation (the draft's tokens are the target's 27% of the time, and prompt lookup's short
matches on a small model's repetitive output do better) and at 1.00-1.04x on copies. A default
that is slower than the one it replaces is no default: `auto` picks the distilled draft once one
beats prompt lookup, and that decision stays here.
"""

from __future__ import annotations

from pathlib import Path

DISTILLED = "distilled"  # model spec of the shipped draft
AUTO = "auto"  # drafter spec: the best drafter shipped for the target
DIRECTORY = Path(__file__).parent / "drafts" / "gemma3-270m"
AUTO_DRAFTER = "ngram"  # what "auto" is (see above); "hybrid:distilled" once the draft beats prompt lookup


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
