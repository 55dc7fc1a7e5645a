"""Training text for draft distillation: text every machine has, no network.

Default sources: Python's standard library source, /usr/share/doc (READMEs, changelogs, often
gzipped) and /usr/share/man (troff, gzipped). Code, prose and markup is a fair spread for a draft
whose target will see chat, code and documents; any directory (a corpus a PyPI package ships,
your own prompts) can be added or used instead.

Files are sampled in a seeded random order up to a byte budget per source, so a capped corpus
still spans each tree instead of its first few folders alphabetically. The held-out split is by
file (a hash of its path), so held-out text is never a neighbour of a training row.
"""

from __future__ import annotations

import gzip
import os
import random
import sysconfig
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

MAX_FILE_BYTES = 1 << 20  # bigger files are mostly generated tables, not text
_TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".html", ".gz", ""}
# Debian ships a licence per package: thousands of near-copies that would dominate the sample.
_SKIP_NAMES = {"copyright", "changelog.Debian.gz"}
# Under the stdlib folder: installed packages (not the standard library, and different on every
# machine) and bytecode.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def default_sources() -> list[Path]:
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path("/usr/share/doc"), Path("/usr/share/man")]
    return [root for root in roots if root.is_dir()]


@dataclass
class Corpus:
    train: torch.Tensor  # (rows, seq_len) token ids, each row starting with BOS when the tokenizer has one
    heldout: torch.Tensor  # (rows, seq_len), from held-out files only
    files: int  # files read
    chars: int  # characters read


def load_corpus(
    tokenizer,
    sources: Sequence[Path],
    seq_len: int,
    max_mb: float,
    heldout_fraction: float = 0.05,
    seed: int = 0,
) -> Corpus:
    """Read up to `max_mb` MB of text (split evenly over `sources`), tokenize, cut into rows."""
    budget = int(max_mb * 1e6 / max(len(sources), 1))
    train_texts: list[str] = []
    heldout_texts: list[str] = []
    files = chars = 0
    for root in sources:
        used = 0
        for path in _sampled_files(Path(root), seed):
            if used >= budget:
                break
            text = read_text(path)
            if not text or not text.strip():
                continue
            text = text[: budget - used]
            used += len(text)
            files += 1
            chars += len(text)
            held = zlib.crc32(str(path.relative_to(root)).encode()) % 10_000 < heldout_fraction * 10_000
            (heldout_texts if held else train_texts).append(text)
    if not heldout_texts and len(train_texts) > 1:  # a small corpus whose hashes all fell in training
        heldout_texts.append(train_texts.pop())
    return Corpus(_rows(tokenizer, train_texts, seq_len), _rows(tokenizer, heldout_texts, seq_len), files, chars)


def read_text(path: Path) -> str | None:
    """The file as text, or None when it is binary or unreadable (gzip is opened transparently)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return None
    if b"\0" in raw[:4096]:
        return None
    return raw[:MAX_FILE_BYTES].decode("utf-8", errors="replace")


def _sampled_files(root: Path, seed: int) -> list[Path]:
    if root.is_file():
        return [root]
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in _SKIP_DIRS]
        found.extend(Path(folder) / n for n in names if Path(n).suffix in _TEXT_SUFFIXES and n not in _SKIP_NAMES)
    files = sorted(found)
    random.Random(seed).shuffle(files)  # sorted first: the same seed gives the same sample anywhere
    return files  # not yet checked for size (read_text does it): a stat of 28,000 man pages takes seconds


def _rows(tokenizer, texts: list[str], seq_len: int) -> torch.Tensor:
    """One stream of documents separated by a blank line, cut into rows of seq_len tokens.

    Each row starts with BOS (when the tokenizer has one): served contexts always do, and models
    like Gemma treat position 0 specially, so rows without it would teach the draft a context it
    never sees.
    """
    bos = tokenizer.bos_token_id
    body = seq_len - (bos is not None)
    if body < 1:
        raise ValueError(f"seq_len {seq_len} is too short")
    separator = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []:
        stream.extend(ids)
        stream.extend(separator)
    n = len(stream) // body
    rows = torch.tensor(stream[: n * body], dtype=torch.long).reshape(n, body)  # (n, body)
    if bos is not None:
        rows = torch.cat([torch.full((n, 1), bos, dtype=torch.long), rows], dim=1)  # (n, seq_len)
    return rows
