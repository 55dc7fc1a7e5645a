"""Sizes in bytes on command lines: --kv-cache-bytes."""

from __future__ import annotations

import argparse

import pytest

from specdec.cli.flag_types import byte_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1073741824", 1 << 30), ("4GiB", 4 << 30), ("512mib", 512 << 20), ("2GB", 2 * 10**9), ("1.5KiB", 1536)],
)
def test_byte_sizes(text, expected):
    assert byte_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "4 parsecs", "0", "0.1B"])
def test_bad_byte_sizes_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="size in bytes"):
        byte_size(text)
