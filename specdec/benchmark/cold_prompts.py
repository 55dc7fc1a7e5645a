"""The cold set: conversations written for `specdec bench --peer vllm` and sent once each in a
server's life, so that no cache of earlier completions holds their answers. None of them comes
from the tuning or held-out sets (heldout.py), the suite's prompts (prompts.py) or
the distillation corpus. Kinds: chat questions, explanations, code, lists, rewriting and
summarising a given passage, and multi-turn chats (rendered through the model's chat template).

The text is data, data/cold.jsonl: one conversation a line, {"kind", "messages": [[role,
text], ...]}, each kind's in its order.
"""

from __future__ import annotations

import json

from specdec.benchmark.prompts import DATA

Messages = tuple[tuple[str, str], ...]


def conversations() -> list[tuple[str, Messages]]:
    """Every prompt as (label, messages), kinds interleaved (a slice of any length mixes them):
    the label is the kind and its index ("code:7"); messages are (role, text) pairs."""
    kinds: dict[str, list[Messages]] = {}
    for line in (DATA / "cold.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        kinds.setdefault(row["kind"], []).append(tuple((role, text) for role, text in row["messages"]))
    out = []
    for index in range(max(len(convs) for convs in kinds.values())):
        for kind, convs in kinds.items():
            if index < len(convs):
                out.append((f"{kind}:{index}", convs[index]))
    return out
