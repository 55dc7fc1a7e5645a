"""The component benchmarks' own flags, on top of the ones they share with `specdec bench`
(specdec/benchmark/flags.py)."""

from __future__ import annotations

import argparse

from specdec.benchmark.flags import add_json, add_max_prompt_tokens, add_prompts, add_target_model
from specdec.benchmark.prompts import WORKLOADS


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    """The component benchmarks' prompts: which workloads, how many, how long, for which target."""
    p.add_argument("--workload", choices=(*WORKLOADS, "all"), default="all")
    add_prompts(p, 2)
    add_max_prompt_tokens(p)
    add_target_model(p)
    add_json(p)


def require_positive(p: argparse.ArgumentParser, args: argparse.Namespace, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
