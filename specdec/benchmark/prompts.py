"""Benchmark workloads, built at run time from this machine's Python standard library.

- copy: "rewrite this function" prompts whose answer copies most of the prompt, the case
  prompt-lookup drafting is made for (code edits, RAG answers quoting their sources).
- free: open-ended openers with nothing to copy from the prompt, where an n-gram drafter finds
  little and speculation must at least not cost much (a small model's greedy output still
  repeats itself, and the drafter looks up generated text too).

The benchmark suite (`specdec bench`) mixes in two more kinds through `suite_workload`: edits (rename
a stdlib function: the answer is the prompt's code with its first line changed) next to the
rewrites, code openers next to the prose ones, and `mixed`, which alternates copy and free.

Sources come from a fixed list of short stdlib functions (15-40 lines, ~150-300 Gemma tokens),
so a run is deterministic for a given Python version; the openers, templates and the list are
data (data/suite.json).
"""

from __future__ import annotations

import importlib
import inspect
import json
import textwrap
from pathlib import Path

WORKLOADS = ("copy", "free")
SUITE_WORKLOADS = ("copy", "free", "mixed")

# The prompt text is data (data/suite.json), read once on import.
DATA = Path(__file__).parent / "data"
_SUITE = json.loads((DATA / "suite.json").read_text(encoding="utf-8"))

# (module, qualified name), in the order they are used; ones outside 15-40 lines in this
# Python's stdlib are skipped, so the choice stays deterministic per Python version.
_COPY_SOURCES = tuple(tuple(pair) for pair in _SUITE["copy_sources"])
_MIN_LINES, _MAX_LINES = 15, 40
_COPY_TEMPLATE = _SUITE["copy_template"]  # "Rewrite the following Python function, adding type hints ..."
_EDIT_TEMPLATE = _SUITE["edit_template"]  # "... rename it to `{new_name}` and keep everything else unchanged."

# Openers to continue, not instructions: the embedded Gemma 3 270M is a base model (no chat
# template) and answers an instruction by repeating it, which would turn them into copy prompts.
FREE_PROSE_PROMPTS = tuple(tuple(pair) for pair in _SUITE["free_prose"])
# Code to continue: the body is not in the prompt.
FREE_CODE_PROMPTS = tuple(tuple(pair) for pair in _SUITE["free_code"])

# The free workload of the older benchmarks (bench/single_process.py, bench/stack.py): the prose, then one code opener.
_FREE_PROMPTS = FREE_PROSE_PROMPTS + FREE_CODE_PROMPTS[:1]


def stdlib_source(module: str, qualname: str) -> str:
    """The dedented source of a stdlib function or method."""
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return textwrap.dedent(inspect.getsource(obj))


def _sources() -> list[tuple[str, str, str]]:
    """(module, qualname, source) of the listed functions that have 15-40 lines in this Python."""
    out = []
    for module, qualname in _COPY_SOURCES:
        source = stdlib_source(module, qualname)
        if _MIN_LINES <= len(source.splitlines()) <= _MAX_LINES:
            out.append((module, qualname, source))
    return out


def copy_prompts() -> list[tuple[str, str]]:
    return [(f"{module}.{qualname}", _COPY_TEMPLATE.format(source=source)) for module, qualname, source in _sources()]


def edit_prompts() -> list[tuple[str, str]]:
    return [
        (
            f"edit:{module}.{qualname}",
            _EDIT_TEMPLATE.format(source=source, new_name=qualname.rsplit(".", 1)[-1].lstrip("_") + "_v2"),
        )
        for module, qualname, source in _sources()
    ]


def _interleave(*lists: list) -> list:
    out = []
    for i in range(max(map(len, lists))):
        out += [items[i] for items in lists if i < len(items)]
    return out


def suite_workload(name: str, n: int) -> list[tuple[str, str]]:
    """The first n (label, prompt) pairs of the suite's workload `name`: copy = stdlib rewrites and
    edits taken in turn (each function once), free = prose and code openers in turn, mixed =
    copy and free in turn."""
    rewrites = copy_prompts()
    edits = edit_prompts()
    # An edit of a function already rewritten would be half a repeat: each function once.
    copy = _interleave(rewrites[0::2], edits[1::2])
    free = _interleave(list(FREE_PROSE_PROMPTS), list(FREE_CODE_PROMPTS))
    prompts = {"copy": copy, "free": free, "mixed": _interleave(copy, free)}.get(name)
    if prompts is None:
        raise ValueError(f"unknown workload {name!r}; expected one of {SUITE_WORKLOADS}")
    if not 1 <= n <= len(prompts):
        raise ValueError(f"workload {name!r} has {len(prompts)} prompts, asked for {n}")
    return prompts[:n]


def workload(name: str, n: int) -> list[tuple[str, str]]:
    """The first n (label, prompt) pairs of workload `name` ("copy" or "free")."""
    if name == "copy":
        prompts = copy_prompts()
    elif name == "free":
        prompts = list(_FREE_PROMPTS)
    else:
        raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOADS}")
    if not 1 <= n <= len(prompts):
        raise ValueError(f"workload {name!r} has {len(prompts)} prompts, asked for {n}")
    return prompts[:n]
