"""Workloads for choosing drafters: a tuning set and a held-out set of each kind.

Defaults (which drafter `auto` means) are chosen on prompts the tuning never saw: the held-out
sets here were written for this benchmark, apart from the tuning prompts, the suite's prompts
(prompts.py) and the distillation corpus, and are reported beside the tuning sets.

- repeated: similar requests served one after another, the case a cache of earlier completions
  is for. Tuning: the same kind of small function for different inputs. Held-out: SQL queries
  over different tables (an agent's text-to-SQL loop).
- free: openers to continue (prose and code), nothing to copy. Tuning: the suite's; held-out:
  written here.
- copy: rewrites whose answer copies the prompt. Tuning: the suite's stdlib rewrites; held-out:
  other stdlib functions under another instruction.
"""

from __future__ import annotations

import json

from specdec.benchmark.prompts import DATA, FREE_CODE_PROMPTS, FREE_PROSE_PROMPTS, copy_prompts, stdlib_source

# The prompt text is data (data/heldout.json): the repeated sets (tuning: one function
# template over 8 aggregates; held-out: SQL over 4 tables), the held-out openers, and the held-out
# copies' instruction and stdlib candidates, in order (those outside 15-40 lines in this Python's
# stdlib, or not written in Python, are skipped).
_HELDOUT = json.loads((DATA / "heldout.json").read_text(encoding="utf-8"))
REPEATED_TUNE = tuple(tuple(pair) for pair in _HELDOUT["repeated_tuning"])
REPEATED_HELDOUT = tuple(tuple(pair) for pair in _HELDOUT["repeated_heldout"])
FREE_HELDOUT = tuple(tuple(pair) for pair in _HELDOUT["free_heldout"])
_COPY_HELDOUT_TEMPLATE = _HELDOUT["copy_template"]
_COPY_HELDOUT_SOURCES = tuple(tuple(pair) for pair in _HELDOUT["copy_sources"])


def copy_heldout() -> list[tuple[str, str]]:
    out = []
    for module, qualname in _COPY_HELDOUT_SOURCES:
        try:
            source = stdlib_source(module, qualname)
        except (OSError, TypeError, AttributeError):
            continue  # not written in Python in this build
        if 15 <= len(source.splitlines()) <= 40:
            out.append((f"{module}.{qualname}", _COPY_HELDOUT_TEMPLATE.format(source=source)))
    return out


def sets() -> dict[str, dict[str, list[tuple[str, str]]]]:
    """{kind: {"tuning": [(label, prompt)], "heldout": [...]}}."""
    return {
        "repeated": {"tuning": list(REPEATED_TUNE), "heldout": list(REPEATED_HELDOUT)},
        "free": {"tuning": [*FREE_PROSE_PROMPTS, *FREE_CODE_PROMPTS], "heldout": list(FREE_HELDOUT)},
        "copy": {"tuning": copy_prompts(), "heldout": copy_heldout()},
    }
