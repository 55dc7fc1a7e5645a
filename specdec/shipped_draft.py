"""The distilled draft shipped for the embedded target, and what the default drafter is.

`specdec distill-draft` wrote it (specdec/drafts/gemma3-270m/: draft.json, vocab.json and the
draft's own two layers in bf16, 22 MB; its embedding and output rows are the target's, taken at
load time). The model spec "distilled" names it anywhere a model is named (`--draft-model
distilled`, `--draft-model hybrid:distilled`).

"auto", the default of `specdec up`, `specdec demo` and `specdec generate --in-process`, is
the n-gram drafter, for every target. `hybrid:distilled` (prompt lookup where the context
repeats, this draft where it never does) ties it on free continuation (0.98-1.04x per prompt)
and is faster on copies (1.06x median) in side-by-side runs (`specdec bench`, 2026-12-01, 2 CPU
cores), but short requests pay for its model's prompt prefill: the 48-token demo ran at 0.85x.
`auto` switches to `hybrid:distilled` in one line (AUTO_DRAFTER) once a shipped draft wins
short requests too, and the target check (only the embedded target gets it) is tested.
"""

from __future__ import annotations

from pathlib import Path

DISTILLED = "distilled"  # model spec of the shipped draft
AUTO = "auto"  # drafter spec: the best drafter shipped for the target
DIRECTORY = Path(__file__).parent / "drafts" / "gemma3-270m"
AUTO_DRAFTER = "ngram"  # what "auto" is (see above); "hybrid:distilled" once the draft wins short requests too


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
