"""`specdec fetch-models --to DIR REPO [REPO ...]`: download hub models into DIR, once, for pods
that load them from there (the gpu overlay's fill Job writes its PersistentVolumeClaim with it).

Each REPO goes to DIR/<name> (the part after the owner), weights as safetensors with their
configs and tokenizer files. Files already there are skipped, so a failed run is resumed by
running it again. When every model is in place, DIR/.complete lists them: the pods' init
containers wait for that file, so none loads a model that is half written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

COMPLETE = ".complete"
# What a transformers checkpoint needs; .bin/.pt/.gguf duplicates of the weights are left out.
FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdec fetch-models", description=__doc__.splitlines()[0])
    p.add_argument("repos", nargs="+", metavar="REPO", help="hub model ids, e.g. Qwen/Qwen3-8B")
    p.add_argument("--to", required=True, metavar="DIR", help="where the models go: DIR/<name> each")
    return p


def fetch(repos: list[str], to: Path, download: Callable[..., str]) -> list[Path]:
    """Every repo into to/<name> with `download` (huggingface_hub's snapshot_download), then the
    marker file. Returns the model directories."""
    to.mkdir(parents=True, exist_ok=True)
    (to / COMPLETE).unlink(missing_ok=True)  # a refill is not complete until it is
    dirs = []
    for repo in repos:
        target = to / repo.rsplit("/", 1)[-1]
        download(repo, local_dir=str(target), allow_patterns=FILES)
        if not any(target.glob("*.safetensors")):
            raise RuntimeError(f"{repo}: no safetensors weights downloaded into {target}")
        dirs.append(target)
    (to / COMPLETE).write_text("".join(f"{repo}\n" for repo in repos))
    return dirs


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if len({repo.rsplit("/", 1)[-1] for repo in args.repos}) != len(args.repos):
        print("specdec fetch-models: two models would share a directory name", file=sys.stderr)
        return 2
    from huggingface_hub import snapshot_download

    try:
        for path in fetch(args.repos, Path(args.to), snapshot_download):
            print(f"{path}: ready", flush=True)
    except Exception as e:  # the hub's errors (no network, a gated or missing repo) end the run
        print(f"specdec fetch-models: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
