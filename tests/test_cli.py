"""The `specdec` command as a user runs it, and the layout rule that keeps the core pure."""

from __future__ import annotations

import subprocess
import sys

from google.protobuf import json_format

from reference import target_only
from specdec.cli import main
from specdec.v1 import generation_pb2 as pb


def test_generate_in_process_json_is_a_generate_response(tiny, tiny_dir, capsys):
    path = tiny_dir("llama", 1)
    code = main(["generate", "--in-process", "--target-model", path, "--draft-model", path, "--max-new-tokens", "12", "--json", "abc abc"])
    assert code == 0
    response = json_format.Parse(capsys.readouterr().out, pb.GenerateResponse())
    target = tiny("llama", 1)
    prompt = target.tokenizer("abc abc")["input_ids"]
    assert list(response.token_ids) == target_only(target.model, prompt, 12, target.eos_token_ids)
    assert response.usage.completion_tokens == len(response.token_ids)
    assert response.usage.prompt_tokens == len(prompt)
    assert response.speculation.draft_tokens > 0 and response.speculation.accepted_tokens == response.speculation.draft_tokens
    assert response.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)


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


def test_core_imports_neither_grpc_nor_ray():
    code = (
        "import sys\n"
        "import specdec.acceptance, specdec.sampling, specdec.rng, specdec.packing, specdec.kv_cache, "
        "specdec.models, specdec.errors, specdec.tiny, specdec.cli\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'ray'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
