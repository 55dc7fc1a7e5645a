"""The distilled draft shipped for the embedded target, and what the default drafter is.

`specdec distill-draft` wrote it (specdec/drafts/gemma3-270m/: draft.json, vocab.json and the
draft's own two layers in bf16, 22 MB; its embedding and output rows are the target's, taken at
load time). The model spec "distilled" names it anywhere a model is named (`--draft-model
distilled`, `--draft-model hybrid:distilled`).

"auto", the default of `specdec up`, `specdec demo` and `specdec generate --in-process`, is
`hybrid:distilled` for the embedded target (prompt lookup where the context repeats, this draft
where it never does) and the n-gram drafter for any other target (a draft must share its
target's tokenizer). With oneDNN's packed kernels (specdec/projection.py) a verify pass with
2-8 drafts costs 1.1-1.3 decode steps, and side by side (`specdec bench`, 2026-12-01, 2 CPU
cores) the hybrid ran at 1.58-1.62x target-only on free continuation (the n-gram drafter
1.57-1.59x) and 4.39-4.84x on copies (4.50-4.58x), with its lookups right more often (a 3-token
match first: 1.00 at the first position on copies against 0.94-1.00), and the 48-token demo at
31.2-32.2 tokens/s against 31.4-32.5. Before those kernels it tied on free text but lost 15% on
short requests to its model's calls, and `auto` was the n-gram drafter.
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
