"""Flags made from config dataclasses (specdec/cli/config_flags.py), and the command lines they
make: every flag name, default, type and choice of cli_flags.json is a public contract (k8s
manifests, scripts and users spell them), so a change there is a change of this file on purpose."""

from __future__ import annotations

import argparse
import json
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import pytest

from specdec.cli.config_flags import add_flags, from_flags
from specdec.core.settings import UNSET, setting, settings_of

CONTRACT = json.loads((Path(__file__).with_name("cli_flags.json")).read_text())


@dataclass(frozen=True)
class Toy:
    name: str = setting(help="required: no default")
    max_batch: int = setting(8, "rounds a pass verifies")
    grace_s: float = setting(1.5, "seconds to finish", type="seconds")
    pipeline: bool = setting(True, "'on': overlap rounds")
    half_precision: bool = setting(True, "fp32 everywhere", flag="full-precision", action="store_false")
    token: str | None = setting(None, "a secret", secret=True, repr=False)
    budget: int = setting(0, "positions per pass", type="nonnegative_int_or_auto", cli_default="auto")
    internal: int = 3  # not a setting: no flag


def _toy_parser(**kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_flags(p, Toy, **kw)
    return p


def test_each_setting_is_one_flag_and_parses_back_to_its_field():
    p = _toy_parser()
    flags = {a.option_strings[0] for a in p._actions if a.option_strings} - {"-h"}
    assert flags == {"--name", "--max-batch", "--grace", "--pipeline", "--full-precision", "--token", "--budget"}
    config = from_flags(Toy, p.parse_args(["--name", "x"]))
    assert config == Toy(name="x", budget=-1)  # the flag's "auto" is AUTO
    config = from_flags(Toy, p.parse_args(["--name", "x", "--max-batch", "3", "--pipeline", "off", "--full-precision"]))
    assert (config.max_batch, config.pipeline, config.half_precision) == (3, False, False)
    assert from_flags(Toy, p.parse_args(["--name", "x"]), internal=7).internal == 7


def test_environment_defaults_are_checked_like_flags_and_secrets_stay_hidden():
    environ = {"T_NAME": "n", "T_GRACE": "2.5", "T_TOKEN": "hunter2"}
    p = _toy_parser(env_prefix="T_", environ=environ)
    config = from_flags(Toy, p.parse_args([]))
    assert (config.name, config.grace_s, config.token) == ("n", 2.5, "hunter2")
    assert "hunter2" not in p.format_help() and "[env T_TOKEN; default set]" in p.format_help()
    with pytest.raises(argparse.ArgumentError, match="--grace: must be a finite number"):
        _toy_parser(env_prefix="T_", environ={"T_GRACE": "-1"}).parse_args(["--name", "x"])


def test_skip_and_command_defaults():
    p = _toy_parser(skip=("token",), defaults={"max_batch": 5})
    args = p.parse_args(["--name", "x"])
    assert not hasattr(args, "token") and from_flags(Toy, args) == Toy(name="x", max_batch=5, budget=-1)


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from specdec.cli import app
    from specdec.coordinator.__main__ import _parser as coordinator
    from specdec.distill import train
    from specdec.draft_service.__main__ import _parser as draft
    from specdec.target_service.__main__ import _parser as target

    parsers = {"coordinator": coordinator({}), "draft": draft({}), "target": target()}
    for name, port in (("up", 50051), ("demo", 0)):
        p = argparse.ArgumentParser(prog=f"specdec {name}")
        app._add_stack_flags(p, port=port)
        if name == "demo":
            p.add_argument("--prompt", default=app.DEMO_PROMPT)
            p.add_argument("--max-new-tokens", type=int, default=48)
        else:
            p.add_argument("--status-every", type=float, default=5.0)
        parsers[name] = p
    captured = {}

    def capture(self, argv=None, namespace=None):
        captured["p"] = self
        raise SystemExit(0)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        with pytest.raises(SystemExit):
            train._parse([])
    finally:
        argparse.ArgumentParser.parse_args = original
    parsers["distill-draft"] = captured["p"]
    return parsers


def _described(action: argparse.Action) -> dict:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return {"switch": True}
    entry = {"default": repr(action.default)}
    kind = getattr(action.type, "__name__", None)
    if kind and kind != "str":
        entry["type"] = kind
    if action.choices:
        entry["choices"] = list(action.choices)
    if type(action) is not argparse._StoreAction:
        entry["action"] = type(action).__name__.strip("_").replace("Action", "")
    if action.required:
        entry["required"] = True
    return entry


def test_the_command_lines_keep_their_flags(monkeypatch):
    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    for name, parser in _parsers().items():
        flags = {a.option_strings[0]: _described(a) for a in parser._actions if a.option_strings[:1] != ["-h"]}
        assert flags == CONTRACT[name], name


@pytest.mark.parametrize("module", ["coordinator", "draft", "target"])
def test_every_setting_is_a_flag_with_its_default_and_parsed_defaults_build_the_defaults(module):
    """Every setting of the configs behind a tier's flags is one of its flags, defaulting to the
    field's default (or its declared CLI default), and the parsed defaults build the config the
    dataclass's own defaults make."""
    from specdec.coordinator.__main__ import CoordinatorConfig
    from specdec.coordinator.engine import EngineConfig
    from specdec.coordinator.server import ServerConfig
    from specdec.draft_service.__main__ import CONFIGS as DRAFT_CONFIGS
    from specdec.target_service.__main__ import PoolCommand
    from specdec.target_service.actor import ActorConfig

    configs = {
        "coordinator": (CoordinatorConfig, ServerConfig, EngineConfig),
        "draft": DRAFT_CONFIGS,
        "target": (PoolCommand, ActorConfig),
    }[module]
    parser = _parsers()[module]
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    args = parser.parse_args(["--draft", "d:1"] if module == "coordinator" else [])
    for cls in configs:
        assert settings_of(cls), cls
        built = from_flags(cls, args)
        for f, s in settings_of(cls):
            action = by_flag[f"--{s.flag_name(f.name)}"]
            if f.default is MISSING or f.name in ("target_pool", "namespace"):
                continue  # required, or the pool's names (the coordinator's parser supplies them)
            if s.cli_default is not UNSET:
                assert action.default == s.cli_default, f.name
                continue
            if s.action is None:
                shown = action.default
                assert shown == f.default or (isinstance(f.default, bool) and shown == ("on" if f.default else "off"))
            assert getattr(built, f.name) == f.default, f"{cls.__name__}.{f.name}"
        names = {f.name for f in fields(cls)}
        assert {f.name for f, _ in settings_of(cls)} <= names
