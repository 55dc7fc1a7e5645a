"""The wire contract: committed generated code matches protos/, buf lint passes,
and the public field names are exactly as documented."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format

from specdec.cli.protogen import REPO_ROOT, generate
from specdec.v1 import common_pb2, draft_pb2, generation_pb2

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _committed_generated() -> set[Path]:
    return {
        p.relative_to(REPO_ROOT)
        for p in (REPO_ROOT / "specdec").rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def test_generated_code_matches_protos(tmp_path: Path) -> None:
    fresh = {p.relative_to(tmp_path) for p in generate(tmp_path)}
    committed = _committed_generated()
    hint = "run `python -m specdec.cli.protogen` and commit the result"
    assert fresh == committed, (
        f"missing: {sorted(map(str, fresh - committed))}, extra: {sorted(map(str, committed - fresh))}; {hint}"
    )
    stale = [str(rel) for rel in sorted(fresh) if (tmp_path / rel).read_bytes() != (REPO_ROOT / rel).read_bytes()]
    assert not stale, f"stale generated files: {stale}; {hint}"


def _buf() -> str:
    # buf-bin installs the binary next to the interpreter, which is not on
    # PATH when the venv is used without being activated.
    found = shutil.which("buf") or shutil.which("buf", path=str(Path(sys.executable).parent))
    assert found, "buf not found: install the dev extras (buf-bin)"
    return found


def test_buf_lint() -> None:
    proc = subprocess.run([_buf(), "lint"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"buf lint exit {proc.returncode}:\n{proc.stdout}{proc.stderr}"


def test_generate_request_round_trip() -> None:
    req = generation_pb2.GenerateRequest(
        prompt_token_ids=[1, 2, 3],
        max_new_tokens=16,
        sampling=common_pb2.SamplingParams(temperature=0.5, top_p=0.9, top_k=40, seed=7),
        stop=["\n\n"],
        speculation=generation_pb2.SpeculationParams(disabled=True, max_draft_tokens=4),
    )
    assert generation_pb2.GenerateRequest.FromString(req.SerializeToString()) == req

    as_dict = json_format.MessageToDict(req)
    assert as_dict == {
        "promptTokenIds": [1, 2, 3],
        "maxNewTokens": 16,
        "sampling": {"temperature": 0.5, "topP": 0.9, "topK": 40, "seed": "7"},
        "stop": ["\n\n"],
        "speculation": {"disabled": True, "maxDraftTokens": 4},
    }
    assert json_format.ParseDict(as_dict, generation_pb2.GenerateRequest()) == req
    assert req.sampling.HasField("seed")

    # The stream request must stay field-for-field identical to the unary one.
    stream_req = generation_pb2.GenerateStreamRequest.FromString(req.SerializeToString())
    assert json_format.MessageToDict(stream_req) == as_dict


def test_propose_response_round_trip() -> None:
    probs = common_pb2.DraftProbs(
        encoding=common_pb2.DRAFT_PROBS_ENCODING_SPARSE_FP32,
        num_tokens=2,
        vocab_size=100,
        values=b"\x00\x00\x80\x3f" * 3,
        indices=b"\x05\x00\x00\x00\x06\x00\x00\x00\x07\x00\x00\x00",
        row_nnz=[1, 2],
    )
    resp = draft_pb2.ProposeResponse(token_ids=[5, 7], draft_probs=probs, cached_len=12)
    assert draft_pb2.ProposeResponse.FromString(resp.SerializeToString()) == resp

    as_dict = json_format.MessageToDict(resp)
    assert set(as_dict) == {"tokenIds", "draftProbs", "cachedLen"}
    assert set(as_dict["draftProbs"]) == {"encoding", "numTokens", "vocabSize", "values", "indices", "rowNnz"}
    assert as_dict["draftProbs"]["encoding"] == "DRAFT_PROBS_ENCODING_SPARSE_FP32"
    assert json_format.ParseDict(as_dict, draft_pb2.ProposeResponse()) == resp


_REQUEST_FIELDS = {
    "prompt": 1,
    "prompt_token_ids": 2,
    "max_new_tokens": 3,
    "sampling": 4,
    "stop": 5,
    "speculation": 6,
    "messages": 7,
}
_RESPONSE_FIELDS = {
    "text": 1,
    "token_ids": 2,
    "finish_reason": 3,
    "usage": 4,
    "speculation": 5,
    "trace_id": 6,
}
# Each public message and its fields, name -> number: renaming or renumbering one breaks clients.
MESSAGE_FIELDS = [
    (generation_pb2.GenerateRequest, _REQUEST_FIELDS),
    (generation_pb2.GenerateStreamRequest, _REQUEST_FIELDS),
    (generation_pb2.GenerateResponse, _RESPONSE_FIELDS),
    (generation_pb2.GenerateStreamResponse, _RESPONSE_FIELDS),
    (generation_pb2.ChatMessage, {"role": 1, "content": 2}),
    (
        generation_pb2.SpeculationStats,
        {
            "rounds": 1,
            "draft_tokens": 2,
            "accepted_tokens": 3,
            "non_speculative_rounds": 4,
            "accepted_per_position": 5,
            "pipelined_rounds": 6,
            "draft_failures": 7,
            "draft_wait_seconds": 8,
            "verify_wait_seconds": 9,
            "generation_seconds": 10,
        },
    ),
    (
        draft_pb2.ProposeRequest,
        {
            "session_id": 1,
            "committed_len": 2,
            "new_tokens": 3,
            "num_draft_tokens": 4,
            "sampling": 5,
            "probs_encoding": 6,
            "model_draft_tokens": 7,
            "tree": 8,
        },
    ),
    (
        draft_pb2.ProposeResponse,
        {"token_ids": 1, "draft_probs": 2, "cached_len": 3, "source": 4, "parent_indices": 5},
    ),
    (draft_pb2.EndSessionRequest, {"session_id": 1, "completion_token_ids": 2}),
]


@pytest.mark.parametrize(("message", "expected"), MESSAGE_FIELDS, ids=[m.DESCRIPTOR.name for m, _ in MESSAGE_FIELDS])
def test_field_names_are_the_contract(message, expected: dict[str, int]) -> None:
    assert {f.name: f.number for f in message.DESCRIPTOR.fields} == expected


def test_enum_values_are_the_contract() -> None:
    assert list(draft_pb2.DraftSource.keys()) == [
        "DRAFT_SOURCE_UNSPECIFIED",
        "DRAFT_SOURCE_NGRAM",
        "DRAFT_SOURCE_MODEL",
        "DRAFT_SOURCE_NGRAM_SHORT",
        "DRAFT_SOURCE_SUFFIX",
    ]
    assert list(generation_pb2.FinishReason.keys()) == [
        "FINISH_REASON_UNSPECIFIED",
        "FINISH_REASON_STOP",
        "FINISH_REASON_LENGTH",
        "FINISH_REASON_CANCELLED",
    ]


def test_services_and_methods_are_the_contract() -> None:
    services = {
        s.full_name: [m.name for m in s.methods]
        for f in (generation_pb2, draft_pb2)
        for s in f.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "specdec.v1.GenerationService": ["Generate", "GenerateStream"],
        "specdec.v1.DraftService": ["Propose", "EndSession"],
    }
    stream = generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].methods_by_name["GenerateStream"]
    assert stream.server_streaming and not stream.client_streaming
