"""`setting`: a config dataclass field that is also a command-line flag, declared once.

The field carries its flag's help, parser and name in its metadata; `specdec.cli.config_flags`
turns the settings of a dataclass into argparse flags and the parsed flags back into the
dataclass. Nothing here parses: the core only says what a setting is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING
from typing import Any

AUTO = -1  # an int setting's "auto": the service decides from what it finds (its hardware, its tiers)
KEY = "setting"  # the field metadata key `setting` fills
UNSET = object()  # Setting.cli_default's "the field's own default"


@dataclasses.dataclass(frozen=True)
class Setting:
    help: str
    # --flag; None: the field's name less a unit suffix _s, dashed (session_ttl_s: --session-ttl).
    flag: str | None = None
    # int, float, str, a callable, or the name of a parser in specdec.cli.flag_types ("port",
    # "byte_size", ...); None: from the default (a bool is on/off, an int an int, a float a float).
    type: Any = None
    choices: tuple | None = None
    metavar: str | None = None
    action: str | None = None  # "store_false": --full-precision sets half_precision to False
    cli_default: Any = UNSET  # the flag's default where it differs from the field's ("auto")
    secret: bool = False  # --help says only whether it is set

    def flag_name(self, field_name: str) -> str:
        return self.flag or field_name.removesuffix("_s").replace("_", "-")


def setting(default: Any = MISSING, help: str = "", *, repr: bool = True, **flag: Any) -> Any:
    """A dataclass field with a flag: `max_batch: int = setting(32, "rounds one pass verifies")`;
    `flag` takes the fields of `Setting` (flag, type, choices, metavar, action, cli_default, secret)."""
    return dataclasses.field(default=default, repr=repr, metadata={KEY: Setting(help, **flag)})


def settings_of(cls: type) -> list[tuple[dataclasses.Field, Setting]]:
    """The fields of dataclass `cls` declared with `setting`, in declaration order."""
    return [(f, f.metadata[KEY]) for f in dataclasses.fields(cls) if KEY in f.metadata]
