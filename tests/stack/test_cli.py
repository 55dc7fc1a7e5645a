"""The `specdec` command as a user runs it."""

from __future__ import annotations

import json
import os
import re

import pytest
from google.protobuf import json_format
from reference import target_only
from tiny import EOS_ID, make_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.cli.app import main
from specdec.v1 import generation_pb2 as pb


def test_generate_in_process_json_is_a_generate_response(tiny, tiny_dir, capsys):
    path = tiny_dir("llama", 1)
    code = main(
        [
            "generate",
            "--in-process",
            "--target-model",
            path,
            "--draft-model",
            path,
            "--max-new-tokens",
            "12",
            "--json",
            "abc abc",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["targetDecoder"], out["draftDecoder"]) == ("fused", "fused")
    response = json_format.ParseDict(out, pb.GenerateResponse(), ignore_unknown_fields=True)
    target = tiny("llama", 1)
    prompt = target.tokenizer("abc abc")["input_ids"]
    assert list(response.token_ids) == target_only(target.model, prompt, 12, target.eos_token_ids)
    assert response.usage.completion_tokens == len(response.token_ids)
    assert response.usage.prompt_tokens == len(prompt)
    assert (
        response.speculation.draft_tokens > 0
        and response.speculation.accepted_tokens == response.speculation.draft_tokens
    )
    assert response.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)


@pytest.mark.parametrize(
    ("kind", "decoder"),
    [(kind, "fused") for kind in ("gemma2", "gemma3", "llama", "llama3", "mistral", "qwen2", "qwen3", "phi3")]
    + [("gpt2", "transformers")],
)
def test_generate_json_names_the_decoder_that_served_the_target(tmp_path, capsys, kind, decoder):
    """Every family loads (Gemma 2 although transformers refuses it SDPA) and decodes, target-only
    and speculating with itself as the draft, exactly as transformers' greedy does (24 tokens,
    past the windows of 8); the JSON says which decoder ran the target and the draft."""
    path = str(make_tiny_model(kind, tmp_path / kind, seed=1, sliding_window=8))
    args = ["generate", "--in-process", "--target-model", path, "--max-new-tokens", "24", "--json", "abc abc"]
    assert main([*args, "--no-speculation"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["targetDecoder"] == decoder and "draftDecoder" not in plain
    assert main([*args, "--draft-model", path]) == 0
    drafted = json.loads(capsys.readouterr().out)
    assert (drafted["targetDecoder"], drafted["draftDecoder"]) == (decoder, decoder)
    assert int(drafted["speculation"]["acceptedTokens"]) > 0
    reference = AutoModelForCausalLM.from_pretrained(path).eval()  # transformers alone, its own attention
    prompt = AutoTokenizer.from_pretrained(path)("abc abc")["input_ids"]
    expected = target_only(reference, prompt, 24, frozenset({EOS_ID}))
    assert [int(t) for t in plain["tokenIds"]] == [int(t) for t in drafted["tokenIds"]] == expected


def test_generate_plain_output_reports_speed_and_acceptance(tiny_dir, capsys):
    code = main(["generate", "--in-process", "--target-model", tiny_dir("gpt2", 1), "--max-new-tokens", "6", "hello"])
    assert code == 0
    err = capsys.readouterr().err
    assert "tokens/s" in err and "acceptance" in err


def test_bad_flags_name_the_field(tiny_dir, capsys):
    args = ["generate", "--in-process", "--target-model", tiny_dir("gpt2", 1), "hello"]
    assert main(args + ["--temperature", "-1"]) == 2
    assert "sampling.temperature" in capsys.readouterr().err
    assert main(args + ["--max-new-tokens", "0"]) == 2
    assert "max_new_tokens" in capsys.readouterr().err


def test_demo_streams_through_the_local_stack_and_stops_every_part(ray_local, tiny, tiny_dir, capsys, monkeypatch):
    from specdec.target_service.pool import NAMESPACE, PREFIX, actor_names
    from specdec.telemetry import tracing

    # The tracer provider is the process's to set, once: a test must not take it from later tests.
    monkeypatch.setattr(tracing, "configure_tracing", lambda *args, **kwargs: None)
    path = tiny_dir("llama", 1)
    code = main(["demo", "--target-model", path, "--prompt", "abc abc abc", "--max-new-tokens", "16"])
    out = capsys.readouterr().out
    assert code == 0, out
    target = tiny("llama", 1)
    expected = target_only(target.model, target.tokenizer("abc abc abc")["input_ids"], 16, target.eos_token_ids)
    assert (
        "abc abc abc" + target.tokenizer.decode(expected, skip_special_tokens=True) + "\n" in out
    )  # the prompt, then the stream
    assert re.search(r"16 tokens in .* tokens/s \| \d+ rounds, acceptance .* trace \(tracing off\)\]", out), (
        out
    )  # ids: test_coordinator
    pid = int(re.search(r"draft service .*process (\d+)\)", out).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the draft server was stopped (and reaped)
    assert actor_names(PREFIX, NAMESPACE) == []  # the target actor was killed
    assert ray_local.is_initialized()  # a Ray the stack did not start is left running


# Refused by `specdec coordinator` and by `specdec up` / `demo` alike: one declaration of the flags.
REFUSED = (
    ["--default-draft-tokens", "9", "--max-draft-tokens", "8"],
    ["--port", "70000"],
    ["--pipeline", "yes"],
    ["--draft-timeout", "0"],
    ["--speculation-max-running", "-1"],
    ["--max-inflight", "0"],
    ["--ray-join", "ray://head:10001"],  # a GCS address, not a Ray Client one
    ["--ray-join", "head"],
)


def test_coordinator_flags_and_environment_map_onto_the_config():
    from specdec.coordinator.__main__ import parse_config

    config = parse_config(
        ["--draft", "127.0.0.1:50052", "--max-inflight", "3"],
        {"SPECDEC_COORDINATOR_MAX_INFLIGHT": "9", "SPECDEC_COORDINATOR_PORT": "0"},
    )
    assert config.server.max_inflight == 3 and config.server.port == 0  # the flag wins over the environment
    assert config.draft == "127.0.0.1:50052" and config.ray_address == "auto" and config.target_model is None
    assert config.ray_join is None and config.pool_wait_s == 0
    assert parse_config(["--draft", "x:1", "--pool-wait", "30"], {}).pool_wait_s == 30
    assert not config.engine.token_tree and parse_config(["--draft", "x:1", "--token-tree", "on"], {}).engine.token_tree
    with pytest.raises(SystemExit):
        parse_config(["--draft", "x:1", "--pool-wait", "-1"], {})
    assert (
        parse_config([], {"SPECDEC_COORDINATOR_DRAFT": "x:1", "SPECDEC_COORDINATOR_RAY_JOIN": "h:6379"}).ray_join
        == "h:6379"
    )
    from_env = parse_config(
        [], {"SPECDEC_COORDINATOR_DRAFT": "dns:///draft:50052", "SPECDEC_COORDINATOR_PIPELINE": "off"}
    )
    assert from_env.draft == "dns:///draft:50052" and not from_env.engine.pipeline and config.engine.pipeline
    with pytest.raises(SystemExit):
        parse_config([], {})  # --draft is required
    for argv in REFUSED:
        with pytest.raises(SystemExit):
            parse_config(["--draft", "x:1", *argv], {})


@pytest.mark.parametrize(
    "argv",
    [
        ["--ray-join", "ray://head:10001"],  # a GCS address, not a Ray Client one
        ["--ray-join", "head"],
        ["--ray-join", "head:6379", "--address", "ray://head:10001"],  # one way to join, not two
    ],
)
def test_target_refuses_a_bad_ray_join_before_touching_ray(argv, capsys):
    from specdec.target_service.__main__ import main as target_main

    try:
        code = target_main(argv)
    except SystemExit as e:  # argparse refuses a malformed value
        code = e.code
    assert code == 2
    assert "--ray-join" in capsys.readouterr().err


def test_up_reads_the_engine_flags_as_the_coordinator_does(monkeypatch):
    from specdec.cli import app
    from specdec.coordinator.__main__ import parse_config

    seen = []

    async def up(config, status_every_s):
        seen.append(config)
        return 0

    # `specdec up` as typed, stopped before it starts anything (no tracing set up for the process).
    monkeypatch.setattr(app, "_up", up)
    monkeypatch.setattr("specdec.telemetry.tracing.configure_tracing", lambda *args, **kwargs: None)
    for argv in (
        [],
        ["--max-draft-tokens", "8", "--default-draft-tokens", "2", "--max-inflight", "3", "--pipeline", "off"],
        ["--adaptive", "off", "--speculation-token-budget", "24", "--draft-timeout", "0.5"],
        ["--http-port", "0", "--served-model-name", "m"],
        ["--http-port", "8123"],
    ):
        seen.clear()
        assert main(["up", "--trace-file", "", *argv]) == 0
        coordinator = parse_config(["--draft", "x:1", *argv], {})
        assert seen[0].engine == coordinator.engine
        for name in ("max_inflight", "http_port", "served_model_name"):
            assert getattr(seen[0].server, name) == getattr(coordinator.server, name), name
    for argv in REFUSED:
        with pytest.raises(SystemExit):
            main(["up", "--trace-file", "", *argv])


def test_http_and_chat_template_flags(tmp_path):
    from specdec.coordinator.__main__ import parse_config

    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    default = parse_config(["--draft", "x:1"], {})
    assert default.server.http_port == 8000 and default.engine.chat_template is None
    given = parse_config(["--draft", "x:1", "--http-port", "0", "--chat-template", str(template)], {})
    assert given.server.http_port is None  # 0: no HTTP API
    assert given.engine.chat_template == template.read_text()
    from_env = parse_config([], {"SPECDEC_COORDINATOR_DRAFT": "x:1", "SPECDEC_COORDINATOR_HTTP_PORT": "9000"})
    assert from_env.server.http_port == 9000
    with pytest.raises(SystemExit):
        parse_config(["--draft", "x:1", "--chat-template", str(tmp_path / "missing.jinja")], {})
