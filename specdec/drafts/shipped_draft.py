"""The distilled draft shipped for the embedded target, and what the default drafter is.

`specdec distill-draft` wrote it (specdec/drafts/gemma3-270m/: draft.json, vocab.json and the
draft's own two layers in bf16, 22 MB; its embedding and output rows are the target's, taken at
load time). The model spec "distilled" names it anywhere a model is named (`--draft-model
distilled`, `--draft-model hybrid:distilled`).

"auto", the default of `specdec up`, `specdec demo` and `specdec generate --in-process`, is
`suffix`, the model-free suffix drafter (draft_service/suffix.py), for every target: chosen on
held-out prompts by `python -m specdec.bench.drafters`, whose rule (`choose_auto` there) takes
the fastest arm that loses at most 3% to plain n-gram lookup on every held-out set, so the default
never does much worse than the simplest drafter; the figures are in docs/performance.md and
bench/results/drafters_merged.json. The shipped draft stays a named choice (`distilled`,
`hybrid:distilled`, `suffix:distilled`).
"""

from __future__ import annotations

from pathlib import Path

DISTILLED = "distilled"  # model spec of the shipped draft
AUTO = "auto"  # drafter spec: the drafter measured best on held-out prompts
DIRECTORY = Path(__file__).parent / "gemma3-270m"
AUTO_DRAFTER = "suffix"  # what "auto" is, for every target (see above)


def resolve_model(spec: str | None) -> str | None:
    """A model spec with "distilled" replaced by the shipped draft's directory."""
    return str(DIRECTORY) if spec == DISTILLED else spec


def available() -> bool:
    return (DIRECTORY / "draft.json").is_file()


def resolve_drafter(draft_spec: str | None, target_spec: str | None) -> str:
    """The drafter a --draft-model value means: "auto" (or None) is AUTO_DRAFTER, which needs no
    model and so suits any target; any other value is kept."""
    if draft_spec not in (None, AUTO):
        return draft_spec
    return AUTO_DRAFTER
