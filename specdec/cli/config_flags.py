"""Command-line flags made from config dataclasses: each `setting` field (specdec.core.settings)
is one flag, with its help, parser and default; the parsed flags build the dataclass back.

    add_flags(parser, ActorConfig)                  # --max-batch, --kv-cache-bytes, ...
    config = from_flags(ActorConfig, parser.parse_args())

With `env_prefix`, a flag's default comes from PREFIX<FLAG> when that is set (a flag on the command
line wins); argparse runs the parser on string defaults, so a bad value there is refused like a
bad flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import MISSING
from typing import Any, TypeVar

from specdec.cli import flag_types
from specdec.core.settings import UNSET, Setting, settings_of

C = TypeVar("C")


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    skip: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    env_prefix: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Add a flag for every setting of dataclass `cls` but the fields in `skip`; `defaults`
    (field name -> value) replace the fields' own for this command."""
    skip, defaults, environ = set(skip), defaults or {}, environ or {}
    for f, s in settings_of(cls):
        if f.name in skip:
            continue
        name = s.flag_name(f.name)
        default = defaults.get(f.name, f.default if s.cli_default is UNSET else s.cli_default)
        kind = _parser_of(s, default)
        if kind is flag_types.on_off and isinstance(default, bool):
            default = "on" if default else "off"
        env = env_prefix + name.upper().replace("-", "_") if env_prefix else None
        if env and env in environ:
            default = environ[env]
        shown = ("set" if default else "unset") if s.secret else default  # --help never prints a secret
        if env:
            text = f"{s.help} [env {env}" + ("]" if default is MISSING else f"; default {shown}]")
        else:
            told = s.action or default is MISSING or "default" in s.help
            text = s.help if told else f"{s.help} (default {shown})"
        if s.action:  # a switch; store_false names the field's opposite (--full-precision: half_precision)
            options = {"action": s.action, **({"dest": f.name} if s.action == "store_false" else {})}
        else:
            options = {
                "default": None if default is MISSING else default,
                "type": kind,
                "choices": s.choices,
                "metavar": s.metavar or ("{on,off}" if kind is flag_types.on_off else None),
                "required": default is MISSING,
            }
        parser.add_argument(f"--{name}", help=text.replace("%", "%%"), **options)


def from_flags(cls: type[C], args: argparse.Namespace, **values: Any) -> C:
    """`cls` built from the parsed flags of its settings (those added), with `values` over them."""
    parsed = {}
    for f, s in settings_of(cls):
        dest = f.name if s.action == "store_false" else s.flag_name(f.name).replace("-", "_")
        if hasattr(args, dest):
            parsed[f.name] = getattr(args, dest)
    return cls(**{**parsed, **values})


def _parser_of(s: Setting, default: Any):
    if s.action:
        return None
    if isinstance(s.type, str):
        return getattr(flag_types, s.type)
    if s.type is not None:
        return None if s.type is str else s.type
    if isinstance(default, bool):
        return flag_types.on_off
    return type(default) if isinstance(default, int | float) else None
