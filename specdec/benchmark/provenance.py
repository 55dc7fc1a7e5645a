"""Where a result came from: the commit of the code that measured it, written into every
benchmark's JSON beside the machine and the versions."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """HEAD of the checkout this code runs from; None outside a git checkout or without git."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
    except OSError:
        return None
    return out.stdout.strip() or None
