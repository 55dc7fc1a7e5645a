"""The `specdec` command: the local stack, generate, trace, and the delegated tier commands."""

from specdec.cli.app import main

__all__ = ["main"]
