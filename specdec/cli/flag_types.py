"""argparse value types shared by the services' command lines.

argparse also runs these on string defaults, so a value taken from an environment variable is
refused with the same message as the flag itself. A setting names one by its name
(`setting(..., type="port")`, specdec.core.settings): the layers below the CLI never import it.
"""

from __future__ import annotations

import argparse
import re

from specdec.core.settings import AUTO


def nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"must be 'on' or 'off', got {text!r}")
    return text == "on"


def seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {value}")
    return value


def gcs_address(text: str) -> str:
    """A Ray cluster's GCS address, HOST:PORT (the head's 6379): what a process joins as a node."""
    if text.startswith("ray://") or ":" not in text:
        raise argparse.ArgumentTypeError(f"takes the cluster's GCS address HOST:PORT (the head's 6379), not {text!r}")
    return text


def nonnegative_int_or_auto(text: str) -> int:
    return AUTO if text == "auto" else nonnegative_int(text)


def probability_or_auto(text: str) -> float | None:
    return None if text == "auto" else probability(text)


def probability(text: str) -> float:
    """A threshold in [0, 1): 0 turns it off, 1 would refuse everything."""
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


_BYTE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def byte_size(text: str) -> int:
    """A size in bytes: 1073741824, 1GiB, 512MiB, 2GB (units are case-insensitive)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _BYTE_UNITS or float(match.group(1)) * _BYTE_UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 4GiB or 512MiB, got {text!r}")
    return int(float(match.group(1)) * _BYTE_UNITS[unit])
