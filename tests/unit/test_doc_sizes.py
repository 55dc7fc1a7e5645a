"""The reference docs stay within their sizes, and every relative link in them names a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The most bytes each doc may hold (performance.md: under 15,000); dated figures go to bench/results/history/.
LIMITS = {"docs/performance.md": 14_999, "docs/design.md": 20_000, "bench/README.md": 20_000, "README.md": 12_000}

_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _docs() -> list[Path]:
    history = ROOT.glob("bench/results/history/*.md")
    return sorted([*ROOT.glob("docs/*.md"), ROOT / "bench/README.md", ROOT / "README.md", *history])


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_each_doc_is_within_its_size(name):
    size = (ROOT / name).stat().st_size
    assert size <= LIMITS[name], f"{name} is {size:,} bytes; its limit is {LIMITS[name]:,} bytes"


def test_every_relative_link_points_to_an_existing_file():
    broken = []
    for doc in _docs():
        for target in _LINK.findall(_CODE.sub("", doc.read_text(encoding="utf-8"))):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)
