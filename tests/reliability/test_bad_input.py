"""Malformed and hostile requests through the public API: a real GenerationServer on 127.0.0.1
over real tiers (the `served` fixture). Each request gets a clear status (INVALID_ARGUMENT naming
the field, RESOURCE_EXHAUSTED for a message over the size limit, ...), a bad request gets no
stream message before it, and after every case health says SERVING and a good request is
answered in full."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2
from serving_kit import until

from specdec.coordinator.server import MAX_MESSAGE_BYTES, SERVICE_NAME
from specdec.draft_service.server import SERVICE_NAME as DRAFT_SERVICE
from specdec.v1 import common_pb2, draft_pb2
from specdec.v1 import generation_pb2 as pb

VOCAB, CONTEXT = 259, 256  # the tiny llama's (checked below)
MAX_DRAFT = 8  # the served engine's max_draft_tokens (checked below)
PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT


# --- the wire format by hand: what protobuf's own builders refuse to write ------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative numbers go as ten-byte two's complement, as protobuf writes them
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, data: bytes) -> bytes:
    return key(number, 2) + varint(len(data)) + data


def valid(**fields) -> bytes:
    """A good request's bytes (prompt ids, 6 new tokens) with `fields` set on top."""
    return pb.GenerateRequest(**{"prompt_token_ids": PROMPT, "max_new_tokens": 6, **fields}).SerializeToString()


def without(number: int, raw: bytes) -> bytes:
    """`raw` less every occurrence of field `number` (so a hand-written one replaces it)."""
    message = pb.GenerateRequest.FromString(raw)
    message.ClearField(pb.GenerateRequest.DESCRIPTOR.fields_by_number[number].name)
    return message.SerializeToString()


def sampling(**fields) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(**fields)


# --- the table ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    request: bytes  # the serialized request, sent as is to Generate and to GenerateStream
    code: grpc.StatusCode
    detail: str = ""  # the status details start with this (the field, for INVALID_ARGUMENT)
    compression: grpc.Compression | None = None


BAD_UTF8 = b"\xff\xfe stop"
CASES = [
    # empty and contradictory prompts
    Case("empty request", b"", INVALID, "prompt: is empty"),
    Case("empty prompt ids", pb.GenerateRequest(max_new_tokens=6).SerializeToString(), INVALID, "prompt: is empty"),
    Case("prompt and prompt ids", valid(prompt="abc"), INVALID, "prompt: give prompt or prompt_token_ids"),
    # token ids outside the vocabulary
    Case("negative token id", valid(prompt_token_ids=[5, -1]), INVALID, "prompt_token_ids: token id -1"),
    Case("int32 min token id", valid(prompt_token_ids=[-(2**31)]), INVALID, "prompt_token_ids:"),
    Case("token id = vocab", valid(prompt_token_ids=[5, VOCAB]), INVALID, f"prompt_token_ids: token id {VOCAB}"),
    Case("int32 max token id", valid(prompt_token_ids=[2**31 - 1]), INVALID, "prompt_token_ids:"),
    # oversize prompts: past the context, then past the message size limit
    Case("prompt ids as long as the context", valid(prompt_token_ids=[5] * CONTEXT), INVALID, "prompt: has 256 tokens"),
    Case("prompt ids, a million", valid(prompt_token_ids=[5] * 1_000_000), INVALID, "prompt: has 1000000 tokens"),
    Case("prompt text past the context", valid(prompt_token_ids=[], prompt="ab " * 200), INVALID, "prompt: has"),
    Case(
        "prompt text of 8 MiB",
        valid(prompt_token_ids=[], prompt="a" * (8 << 20)),
        INVALID,
        "prompt: has 8388608 characters",
    ),
    Case(
        "message past the size limit",
        valid(prompt_token_ids=[], prompt="a" * (MAX_MESSAGE_BYTES + 1)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
    Case(
        "gzip bomb past the size limit",
        valid(prompt_token_ids=[], prompt="a" * (2 * MAX_MESSAGE_BYTES)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        compression=grpc.Compression.Gzip,
    ),
    # huge and out-of-range numbers
    Case("max_new_tokens 0", valid(max_new_tokens=0), INVALID, "max_new_tokens: must be in [1,"),
    Case("max_new_tokens 2^31-1", valid(max_new_tokens=2**31 - 1), INVALID, "max_new_tokens:"),
    Case("max_new_tokens 2^32-1", valid(max_new_tokens=2**32 - 1), INVALID, "max_new_tokens:"),
    Case("max_new_tokens -1 as a varint", without(3, valid()) + key(3, 0) + varint(-1), INVALID, "max_new_tokens:"),
    Case(
        "max_draft_tokens past the bound",
        valid(speculation=pb.SpeculationParams(max_draft_tokens=MAX_DRAFT + 1)),
        INVALID,
        "speculation.max_draft_tokens:",
    ),
    Case(
        "max_draft_tokens 2^32-1",
        valid(speculation=pb.SpeculationParams(max_draft_tokens=2**32 - 1)),
        INVALID,
        "speculation.max_draft_tokens:",
    ),
    Case(
        "cache_affinity_key past 256 bytes",
        valid(speculation=pb.SpeculationParams(cache_affinity_key="k" * 257)),
        INVALID,
        "speculation.cache_affinity_key:",
    ),
    Case("cache_affinity_key of 256 bytes", valid(speculation=pb.SpeculationParams(cache_affinity_key="k" * 256)), OK),
    Case("top_k 2^32-1 (no cut)", valid(sampling=sampling(temperature=1.0, top_k=2**32 - 1, seed=3)), OK),
    Case("seed 2^64-1", valid(sampling=sampling(temperature=1.0, seed=2**64 - 1)), OK),
    Case("temperature the largest float", valid(sampling=sampling(temperature=3.4e38, seed=3)), OK),
    Case(
        "temperature the smallest float",
        valid(sampling=sampling(temperature=1e-45, seed=3)),
        INVALID,
        "sampling.temperature: must be 0 (greedy) or",
    ),
    # negative, NaN and infinite floats
    Case("temperature -1", valid(sampling=sampling(temperature=-1.0)), INVALID, "sampling.temperature:"),
    Case("temperature NaN", valid(sampling=sampling(temperature=math.nan)), INVALID, "sampling.temperature:"),
    Case("temperature +inf", valid(sampling=sampling(temperature=math.inf)), INVALID, "sampling.temperature:"),
    Case("temperature -inf", valid(sampling=sampling(temperature=-math.inf)), INVALID, "sampling.temperature:"),
    Case("top_p NaN", valid(sampling=sampling(temperature=1.0, top_p=math.nan)), INVALID, "sampling.top_p:"),
    Case("top_p +inf", valid(sampling=sampling(temperature=1.0, top_p=math.inf)), INVALID, "sampling.top_p:"),
    Case("top_p -0.5", valid(sampling=sampling(temperature=1.0, top_p=-0.5)), INVALID, "sampling.top_p:"),
    Case("top_p 1.5", valid(sampling=sampling(temperature=1.0, top_p=1.5)), INVALID, "sampling.top_p:"),
    # stop strings
    Case("stop not UTF-8", valid() + length_delimited(5, BAD_UTF8), INVALID, "stop: is not valid UTF-8"),
    Case(
        "stop a lone surrogate",
        valid() + length_delimited(5, "\ud800".encode("utf-8", "surrogatepass")),
        INVALID,
        "stop: is not valid UTF-8",
    ),
    Case(
        "prompt not UTF-8",
        without(2, valid()) + length_delimited(1, b"ok \xc0\xaf"),
        INVALID,
        "prompt: is not valid UTF-8",
    ),
    Case("too many stop strings", valid(stop=["x"] * 10_000), INVALID, "stop: at most 16 strings"),
    Case("a stop string of 1 MiB", valid(stop=["y" * (1 << 20)]), INVALID, "stop: each at most 256 characters"),
    Case("empty and odd stop strings (fine)", valid(stop=["", "\x00", "\u202e", "\U0001f600"]), OK),
    # wrong types and wrong wire types
    Case(
        "another message's bytes",
        health_pb2.HealthCheckRequest(service="x" * 40).SerializeToString(),
        INVALID,
        "max_new_tokens:",
    ),
    Case(
        "a response's bytes",
        pb.GenerateResponse(text="hi", token_ids=[5, 6], finish_reason=pb.FINISH_REASON_STOP).SerializeToString(),
        INVALID,
        "prompt: give prompt or prompt_token_ids",
    ),
    Case("max_new_tokens as bytes", without(3, valid()) + length_delimited(3, b"\x06"), INVALID, "max_new_tokens:"),
    Case("sampling as a varint", valid() + key(4, 0) + varint(7), OK),
    Case(
        "sampling of garbage bytes",
        valid() + length_delimited(4, b"\xff\xff\xff"),
        INVALID,
        "sampling: is not a serialized specdec.v1.SamplingParams",
    ),
    Case("speculation with a wrong-type field", valid() + length_delimited(6, key(2, 5) + b"\x01\x02\x03\x04"), OK),
    Case(
        "truncated message",
        valid() + length_delimited(1, b"abc")[:-2],
        INVALID,
        "request: is not a serialized specdec.v1.",
    ),
    Case(
        "varint that never ends",
        valid() + key(3, 0) + b"\xff" * 11,
        INVALID,
        "request: is not a serialized specdec.v1.",
    ),
    Case(
        "unknown fields (ignored)",
        valid() + key(99, 0) + varint(1) + length_delimited(100, b"\xff" * 64) + key(101, 5) + b"\0\0\0\0",
        OK,
    ),
    Case("an end-group tag", valid() + key(7, 4), INVALID, "request: is not a serialized specdec.v1."),
]


def _call(served, case: Case, method: str):
    """(status, details, messages) of one call with `case.request` as raw bytes."""
    path = f"/{SERVICE_NAME}/{method}"
    messages = []
    try:
        if method == "Generate":
            messages.append(
                pb.GenerateResponse.FromString(
                    served.channel.unary_unary(path)(case.request, timeout=60, compression=case.compression)
                )
            )
        else:
            for raw in served.channel.unary_stream(path)(case.request, timeout=60, compression=case.compression):
                messages.append(pb.GenerateStreamResponse.FromString(raw))
    except grpc.RpcError as e:
        return e.code(), e.details() or "", messages
    return OK, "", messages


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_request_gets_a_clear_status_and_leaves_the_server_healthy(served, case):
    for method in ("Generate", "GenerateStream"):
        code, details, messages = _call(served, case, method)
        assert (code, details[: len(case.detail)]) == (case.code, case.detail), f"{method}: {code.name} {details!r}"
        if code is OK:
            assert messages[-1].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
            assert 1 <= sum(len(m.token_ids) for m in messages) <= 6
        else:
            assert messages == []  # an empty stream: nothing before the status
    served.assert_healthy()


def test_the_table_matches_the_served_model(served):
    assert (
        served.engine.target.vocab_size,
        served.engine.target.max_context,
        served.engine.config.max_draft_tokens,
    ) == (VOCAB, CONTEXT, MAX_DRAFT)
    assert len(CASES) >= 30


# --- what is not a request at all ------------------------------------------------------------------------------


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
JUNK = {
    "random bytes": bytes(range(256)) * 64,
    "an HTTP/1.1 request": b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    "an HTTP/1.1 POST to the method": b"POST /specdec.v1.GenerationService/Generate HTTP/1.1\r\n"
    b"Host: x\r\nContent-Length: 5\r\n\r\nhello",
    "the HTTP/2 preface, then junk frames": HTTP2_PREFACE + b"\x00\x00\x04\xff\x00\x00\x00\x00\x01" + b"\xee" * 4096,
    "a TLS ClientHello": bytes.fromhex("16030100a5010000a10303") + b"\x00" * 160,
}


@pytest.mark.parametrize("junk", list(JUNK.values()), ids=list(JUNK))
def test_garbage_on_the_port_is_dropped(served, junk):
    host, port = served.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(junk)
        received = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the server closes the connection; a recv timeout fails the test
            chunk = s.recv(65536)
            if not chunk:
                break
            received += chunk
        else:
            pytest.fail("the server kept the connection open")
    assert not received.startswith(b"HTTP/1.1 200")
    served.assert_healthy()


def test_unknown_method_is_unimplemented(served):
    with pytest.raises(grpc.RpcError) as info:
        served.channel.unary_unary(f"/{SERVICE_NAME}/Delete")(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    served.assert_healthy()


def test_oversize_metadata_is_refused(served):
    with pytest.raises(grpc.RpcError) as info:
        served.stub.Generate(served.good_request(), metadata=(("x-junk", "j" * (1 << 20)),), timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value  # grpc's hard limit on metadata: 16 KiB
    served.assert_healthy()


def test_a_deadline_already_spent_is_deadline_exceeded(served):
    with pytest.raises(grpc.RpcError) as info:
        served.stub.Generate(served.good_request(max_new_tokens=64), timeout=0.001)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    until(lambda: served.server.stats.in_flight == 0)
    assert served.sessions() == (0, 0)
    served.assert_healthy()


# --- clients that go away mid-stream -----------------------------------------------------------------------------


def test_a_client_that_closes_its_channel_mid_stream_frees_both_tiers(served):
    from specdec.v1 import generation_pb2_grpc

    failed = served.server.stats.failed
    channel = grpc.insecure_channel(served.address)
    stream = generation_pb2_grpc.GenerationServiceStub(channel).GenerateStream(
        pb.GenerateStreamRequest(prompt_token_ids=PROMPT, max_new_tokens=200), timeout=60
    )
    assert next(stream).token_ids
    channel.close()  # no cancel: the connection just goes
    until(lambda: served.server.stats.in_flight == 0 and served.server.stats.failed == failed + 1)
    until(lambda: served.sessions() == (0, 0))
    served.assert_healthy()


def test_a_client_killed_mid_stream_frees_both_tiers(served):
    """kill -9 of the client process: the TCP connection is reset under the stream."""
    client = textwrap.dedent(f"""
        import grpc, sys
        from specdec.v1 import generation_pb2 as pb, generation_pb2_grpc
        channel = grpc.insecure_channel("{served.address}")
        request = pb.GenerateStreamRequest(prompt_token_ids={PROMPT}, max_new_tokens=200)
        stream = generation_pb2_grpc.GenerationServiceStub(channel).GenerateStream(request, timeout=60)
        next(stream)
        print("streaming", flush=True)
        sys.stdin.read()
    """)
    process = subprocess.Popen([sys.executable, "-c", client], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"streaming\n"
        assert served.server.stats.in_flight == 1
    finally:
        process.kill()
        process.wait(10)
    until(lambda: served.server.stats.in_flight == 0)
    until(lambda: served.sessions() == (0, 0))
    served.assert_healthy()


# --- the draft tier's own API: an unknown enum value ---------------------------------------------------------------


def test_unknown_enum_value_on_the_draft_tier_is_invalid_argument(served):
    request = draft_pb2.ProposeRequest(session_id="s", new_tokens=PROMPT, num_draft_tokens=2, probs_encoding=99)
    with grpc.insecure_channel(served.draft_address) as channel:
        propose = channel.unary_unary(f"/{DRAFT_SERVICE}/Propose")
        with pytest.raises(grpc.RpcError) as info:
            propose(
                request.SerializeToString(), metadata=(("authorization", f"Bearer {served.draft_token}"),), timeout=10
            )
    assert info.value.code() == INVALID and info.value.details().startswith("probs_encoding: unknown value 99")
    served.assert_healthy()
