"""The flags the benchmarks share, declared once: a flag is spelled, typed and described the same
in `specdec bench` and in every component benchmark that takes it (bench/flags.py adds theirs),
and each passes only what differs (its default, a more exact help)."""

from __future__ import annotations

import argparse

EMBEDDED = "the embedded Gemma 3 270M"


def add_json(p: argparse.ArgumentParser, help: str = "write the results as JSON") -> None:
    p.add_argument("--json", default=None, metavar="PATH", help=help)


def add_repeats(
    p: argparse.ArgumentParser, default: int, help: str = "repeats of every cell; figures are medians"
) -> None:
    p.add_argument("--repeats", type=int, default=default, help=f"{help} (default {default})")


def add_max_new_tokens(p: argparse.ArgumentParser, default: int, help: str = "tokens a request") -> None:
    p.add_argument("--max-new-tokens", type=int, default=default, help=f"{help} (default {default})")


def add_k(p: argparse.ArgumentParser, default: int, help: str = "the most draft tokens a round") -> None:
    p.add_argument("--k", type=int, default=default, help=f"{help} (default {default})")


def add_prompts(p: argparse.ArgumentParser, default: int, help: str = "prompts per workload") -> None:
    p.add_argument("--prompts", type=int, default=default, help=f"{help} (default {default})")


def add_target_model(p: argparse.ArgumentParser, flag: str = "--target-model") -> None:
    p.add_argument(flag, default=None, help=f"local dir, .gguf file or hub id (default: {EMBEDDED})")


def add_max_prompt_tokens(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=0,
        help="keep only the last N prompt tokens (0: no limit; for tiny test models)",
    )
