"""The distilled draft shipped for the embedded target, and the default drafter it makes.

`specdec distill-draft` wrote it (specdec/drafts/gemma3-270m/: draft.json, vocab.json and the
draft's own layers in bf16; its embedding and output rows are the target's, taken at load time).
The model spec "distilled" names it anywhere a model is named (`--draft-model distilled`,
`hybrid:distilled`), and "auto", the default of `specdec up`, `specdec demo` and
`specdec generate --in-process`, resolves to the hybrid drafter over it when the target is the
embedded model, else to the n-gram drafter (a draft must share its target's tokenizer, and only
the embedded target has one shipped).
"""

from __future__ import annotations

from pathlib import Path

DISTILLED = "distilled"  # model spec of the shipped draft
AUTO = "auto"  # drafter spec: the best shipped drafter for the target
DIRECTORY = Path(__file__).parent / "drafts" / "gemma3-270m"


def resolve_model(spec: str | None) -> str | None:
    """A model spec with "distilled" replaced by the shipped draft's directory."""
    return str(DIRECTORY) if spec == DISTILLED else spec


def available() -> bool:
    return (DIRECTORY / "draft.json").is_file()


def resolve_drafter(draft_spec: str | None, target_spec: str | None) -> str:
    """The drafter a --draft-model value means: "auto" (or None) becomes "hybrid:distilled" for the
    embedded target when the draft is shipped, else "ngram"; any other value is kept."""
    if draft_spec not in (None, AUTO):
        return draft_spec
    embedded = target_spec in (None, "default")
    return f"hybrid:{DISTILLED}" if embedded and available() else "ngram"
