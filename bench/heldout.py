"""Workloads for choosing drafters: a tuning set and a held-out set of each kind.

Defaults (which drafter `auto` means) are chosen on prompts the tuning never saw: the held-out
sets here were written for this benchmark, apart from the tuning prompts, the suite's prompts
(bench/prompts.py) and the distillation corpus, and are reported beside the tuning sets.

- repeated: similar requests served one after another, the case a cache of earlier completions
  is for. Tuning: the same kind of small function for different inputs. Held-out: SQL queries
  over different tables (an agent's text-to-SQL loop).
- free: openers to continue (prose and code), nothing to copy. Tuning: the suite's; held-out:
  written here.
- copy: rewrites whose answer copies the prompt. Tuning: the suite's stdlib rewrites; held-out:
  other stdlib functions under another instruction.
"""

from __future__ import annotations

from specdec.bench.prompts import FREE_CODE_PROMPTS, FREE_PROSE_PROMPTS, copy_prompts, stdlib_source

_FUNCTION_TEMPLATE = 'def {name}(values):\n    """Return the {what} of a list of numbers."""\n'
REPEATED_TUNE = tuple(
    (name, _FUNCTION_TEMPLATE.format(name=name, what=what))
    for name, what in (
        ("total", "sum"),
        ("product", "product"),
        ("largest", "largest value"),
        ("smallest", "smallest value"),
        ("mean", "arithmetic mean"),
        ("spread", "difference between the largest and the smallest value"),
        ("count_positive", "number of positive values"),
        ("count_even", "number of even values"),
    )
)

_SQL_TEMPLATE = "-- SQLite\n-- CREATE TABLE {table} ({columns});\n-- Question: {question}\nSELECT"
REPEATED_HELDOUT = tuple(
    (table + ":" + str(i), _SQL_TEMPLATE.format(table=table, columns=columns, question=question))
    for i, (table, columns, question) in enumerate(
        (
            ("orders", "id INTEGER, customer TEXT, total REAL, placed_at TEXT", "How many orders per customer?"),
            ("orders", "id INTEGER, customer TEXT, total REAL, placed_at TEXT", "Total spent by each customer?"),
            ("books", "id INTEGER, title TEXT, author TEXT, year INTEGER", "How many books per author?"),
            ("books", "id INTEGER, title TEXT, author TEXT, year INTEGER", "The newest book of each author?"),
            ("flights", "id INTEGER, origin TEXT, destination TEXT, minutes INTEGER", "Flights per origin?"),
            ("flights", "id INTEGER, origin TEXT, destination TEXT, minutes INTEGER", "Mean minutes per route?"),
            ("patients", "id INTEGER, name TEXT, ward TEXT, admitted TEXT", "How many patients per ward?"),
            ("patients", "id INTEGER, name TEXT, ward TEXT, admitted TEXT", "Latest admission in each ward?"),
        )
    )
)

FREE_HELDOUT = (
    ("bread", "The first time I tried to bake bread at home, the dough"),
    ("volcano", "Volcanoes form where molten rock from deep inside the Earth"),
    ("election", "On the morning of the election, the small town's only cafe"),
    ("octopus", "Octopuses are remarkable problem solvers. In one experiment,"),
    ("intervals", 'def merge_intervals(intervals):\n    """Merge overlapping [start, end] intervals."""\n'),
    (
        "lru",
        "class LRUCache:\n"
        '    """A fixed-size cache that evicts the least recently used key."""\n\n'
        "    def __init__(self, capacity):\n",
    ),
)

_COPY_HELDOUT_TEMPLATE = (
    "Add a one-line docstring to this function and repeat it otherwise exactly:\n\n"
    "```python\n{source}```\n\nWith the docstring:\n```python\n"
)
# Candidates in order; those outside 15-40 lines in this Python's stdlib (or not in Python) are skipped.
_COPY_HELDOUT_SOURCES = (
    ("posixpath", "join"),
    ("posixpath", "normpath"),
    ("posixpath", "relpath"),
    ("ntpath", "splitext"),
    ("fnmatch", "filter"),
    ("calendar", "Calendar.itermonthdays2"),
    ("shlex", "join"),
    ("gettext", "c2py"),
    ("statistics", "median_grouped"),
    ("statistics", "variance"),
    ("random", "Random.choices"),
    ("posixpath", "expanduser"),
    ("posixpath", "commonpath"),
)


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
