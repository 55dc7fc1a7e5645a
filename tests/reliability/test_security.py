"""Security basics: loopback by default, message size limits on every server and client, optional
TLS on the public port, a shared token on the draft tier's port, and no token, prompt or
generated text in logs or span attributes."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import ssl
import subprocess
import sys
import time

import grpc
import httpx2 as httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

import specdec.coordinator.__main__ as coordinator_main
import specdec.draft_service.__main__ as draft_main
from specdec.cli import app as cli
from specdec.coordinator import server as coordinator_server
from specdec.coordinator.clients import DraftClient, DraftClientConfig
from specdec.coordinator.server import MAX_MESSAGE_BYTES, SERVICE_NAME, GenerationServer, ServerConfig
from specdec.core.sampling import SamplingParams
from specdec.draft_service import server as draft_server
from specdec.local.stack import StackConfig
from specdec.telemetry.trace_file import read_spans
from specdec.v1 import draft_pb2, draft_pb2_grpc, generation_pb2_grpc
from specdec.v1 import generation_pb2 as pb

PROMPT = [5, 17, 42, 99, 7, 5, 17, 42, 120, 33, 64, 5, 17]


# --- where services listen -------------------------------------------------------------------------------------


def test_every_service_listens_on_loopback_by_default(monkeypatch):
    assert coordinator_server.ServerConfig().host == "127.0.0.1"
    assert StackConfig().server.host == "127.0.0.1"
    assert coordinator_main.parse_config(["--draft", "d:1"], {}).server.host == "127.0.0.1"
    assert draft_main.parse_config([], {}).host == "127.0.0.1"
    assert (
        coordinator_main.parse_config(["--draft", "d:1", "--host", "0.0.0.0"], {}).server.host == "0.0.0.0"
    )  # configurable
    assert draft_main.parse_config([], {"SPECDEC_DRAFT_HOST": "10.0.0.7"}).host == "10.0.0.7"

    seen = []

    async def up(config, status_every_s):
        seen.append(config)
        return 0

    # `specdec up` as typed, stopped before it starts anything (no tracing set up for the process).
    monkeypatch.setattr(cli, "_up", up)
    monkeypatch.setattr("specdec.telemetry.tracing.configure_tracing", lambda *args, **kwargs: None)
    assert cli.main(["up", "--trace-file", ""]) == 0
    assert seen[0].server.host == "127.0.0.1" and seen[0].server.port == 50051
    assert seen[0].server.http_port == 8000  # the HTTP API on the same (loopback) host


# --- message size limits ---------------------------------------------------------------------------------------


def test_message_size_limits_are_set_on_every_server_and_client():
    options = dict(coordinator_server.SERVER_OPTIONS)
    assert (
        options["grpc.max_receive_message_length"]
        == options["grpc.max_send_message_length"]
        == MAX_MESSAGE_BYTES
        == 16 << 20
    )
    options = dict(draft_server.SERVER_OPTIONS)
    assert options["grpc.max_receive_message_length"] == 16 << 20
    # The draft server sends what the draft client accepts (dense q is 1 MiB per draft token).
    assert options["grpc.max_send_message_length"] == DraftClientConfig().max_receive_bytes
    assert DraftClientConfig().max_send_bytes == 16 << 20


def test_oversize_messages_are_resource_exhausted_on_both_ports(served):
    just_under = pb.GenerateRequest(prompt="a" * (MAX_MESSAGE_BYTES - 64), max_new_tokens=4)
    assert just_under.ByteSize() <= MAX_MESSAGE_BYTES
    with pytest.raises(grpc.RpcError) as info:
        served.stub.Generate(just_under, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details().startswith(
        "prompt: "
    )  # received, then refused
    with pytest.raises(grpc.RpcError) as info:
        served.stub.Generate(pb.GenerateRequest(prompt="a" * (MAX_MESSAGE_BYTES + 1), max_new_tokens=4), timeout=60)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    with grpc.insecure_channel(served.draft_address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            request = draft_pb2.ProposeRequest(
                session_id="big", new_tokens=[300] * (9 << 20), num_draft_tokens=2
            )  # 2 bytes an id: 18 MiB
            draft_pb2_grpc.DraftServiceStub(channel).Propose(
                request, metadata=(("authorization", f"Bearer {served.draft_token}"),), timeout=30
            )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    served.assert_healthy()


# --- TLS on the public port --------------------------------------------------------------------------------------


def self_signed(name: str = "localhost") -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) for `name` and 127.0.0.1, valid for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.fixture(scope="module")
def tls_server(served, tmp_path_factory):
    """A second GenerationServer over the served engine, with TLS; yields (address, CA file)."""
    cert, key = self_signed()
    root = tmp_path_factory.mktemp("tls")
    (root / "cert.pem").write_bytes(cert)
    (root / "key.pem").write_bytes(key)

    async def start():
        server = GenerationServer(served.engine, ServerConfig(port=0, http_port=0, tls=(cert, key)))
        return server, await server.start()

    server, port = served.loop.run(start())
    root.joinpath("http_port").write_text(str(server.http_port))
    yield f"127.0.0.1:{port}", root
    served.loop.run(server.stop(0))


def test_a_tls_client_is_answered_and_a_plaintext_one_is_not(tls_server, served):
    address, root = tls_server
    credentials = grpc.ssl_channel_credentials(root_certificates=(root / "cert.pem").read_bytes())
    with grpc.secure_channel(address, credentials) as channel:
        response = generation_pb2_grpc.GenerationServiceStub(channel).Generate(served.good_request(), timeout=30)
        assert len(response.token_ids) == 6
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            generation_pb2_grpc.GenerationServiceStub(channel).Generate(served.good_request(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    other_ca, _ = self_signed()  # a certificate the server's was not signed by
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=other_ca)) as channel:
        with pytest.raises(grpc.RpcError) as info:
            generation_pb2_grpc.GenerationServiceStub(channel).Generate(served.good_request(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_http_port_serves_https_with_the_same_certificate(tls_server):
    """One certificate for both public ports: HTTPS answers a client that trusts it, a plaintext
    request and a client with another CA get no answer."""
    _, root = tls_server
    port = int((root / "http_port").read_text())
    with httpx.Client(verify=ssl.create_default_context(cafile=str(root / "cert.pem"))) as client:
        assert client.get(f"https://127.0.0.1:{port}/health", timeout=10).status_code == 200
        models = client.get(f"https://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
    other_ca, _ = self_signed()
    other = ssl.create_default_context(cadata=other_ca.decode())
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"https://127.0.0.1:{port}/health", timeout=10, verify=other)


def test_cli_generate_calls_over_tls_with_tls_ca(tls_server, capsys):
    address, root = tls_server
    assert (
        cli.main(
            [
                "generate",
                "--address",
                address,
                "--tls-ca",
                str(root / "cert.pem"),
                "--max-new-tokens",
                "4",
                "--json",
                "abc abc",
            ]
        )
        == 0
    )
    assert '"tokenIds"' in capsys.readouterr().out
    assert (
        cli.main(["generate", "--address", address, "--timeout", "10", "--max-new-tokens", "4", "abc"]) == 1
    )  # plaintext to a TLS port
    assert "UNAVAILABLE" in capsys.readouterr().err
    assert cli.main(["generate", "--address", address, "--tls-ca", str(root / "missing.pem"), "abc"]) == 2


def test_coordinator_flags_and_environment_give_the_tls_files(tls_server):
    _, root = tls_server
    cert, key = (root / "cert.pem").read_bytes(), (root / "key.pem").read_bytes()
    config = coordinator_main.parse_config(
        ["--draft", "d:1", "--tls-cert", str(root / "cert.pem"), "--tls-key", str(root / "key.pem")], {}
    )
    assert config.server.tls == (cert, key) and key.decode() not in repr(config)
    env = {"SPECDEC_COORDINATOR_TLS_CERT": str(root / "cert.pem"), "SPECDEC_COORDINATOR_TLS_KEY": str(root / "key.pem")}
    assert coordinator_main.parse_config(["--draft", "d:1"], env).server.tls == (cert, key)
    assert coordinator_main.parse_config(["--draft", "d:1"], {}).server.tls is None
    with pytest.raises(SystemExit):
        coordinator_main.parse_config(["--draft", "d:1", "--tls-cert", str(root / "cert.pem")], {})  # no key
    with pytest.raises(SystemExit):
        coordinator_main.parse_config(
            ["--draft", "d:1", "--tls-cert", str(root / "nope"), "--tls-key", str(root / "nope")], {}
        )


# --- a token on the draft tier ----------------------------------------------------------------------------------------


# --- the public API's key -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server(served):
    """A GenerationServer over the served engine with an API key, gRPC and HTTP; yields (server, key)."""
    key = "sk-" + os.urandom(8).hex()

    async def start():
        server = GenerationServer(served.engine, ServerConfig(port=0, http_port=0, api_key=key))
        await server.start()
        return server

    server = served.loop.run(start())
    yield server, key
    served.loop.run(server.stop(0))


def test_an_api_key_is_required_on_both_apis_but_not_for_health(keyed_server, served, capsys):
    server, key = keyed_server
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        for metadata in (None, (("authorization", "Bearer wrong"),), (("authorization", key),)):
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(served.good_request(), metadata=metadata, timeout=30)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
        with pytest.raises(grpc.RpcError) as info:
            list(stub.GenerateStream(pb.GenerateStreamRequest(prompt_token_ids=PROMPT), timeout=30))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = (("authorization", f"Bearer {key}"),)
        assert len(stub.Generate(served.good_request(), metadata=good, timeout=30).token_ids) == 6
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # probes carry no secret
    base = f"http://127.0.0.1:{server.http_port}"
    refused = httpx.get(base + "/v1/models", timeout=10)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    refused = httpx.post(base + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=10)
    assert refused.status_code == 401
    assert httpx.get(base + "/health", timeout=10).status_code == 200
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    completion = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=3)
    assert completion.usage.completion_tokens == 3
    client.close()
    code = cli.main(
        ["generate", "x", "--address", f"127.0.0.1:{server.port}", "--max-new-tokens", "2", "--api-key", key]
    )
    assert code == 0
    assert cli.main(["generate", "x", "--address", f"127.0.0.1:{server.port}", "--max-new-tokens", "2"]) != 0
    assert key not in capsys.readouterr().err


def test_api_key_flags_and_environment_and_no_key_in_help_or_repr():
    key = "sk-" + os.urandom(8).hex()
    config = coordinator_main.parse_config(["--draft", "d:1"], {"SPECDEC_COORDINATOR_API_KEY": key})
    assert config.server.api_key == key and key not in repr(config)
    assert coordinator_main.parse_config(["--draft", "d:1"], {}).server.api_key is None
    assert key not in coordinator_main._parser({"SPECDEC_COORDINATOR_API_KEY": key}).format_help()


def test_token_flags_and_environment_and_no_token_in_help_or_repr():
    token = "tok-" + os.urandom(8).hex()
    assert draft_main.parse_config([], {"SPECDEC_DRAFT_AUTH_TOKEN": token}).auth_token == token
    assert draft_main.parse_config(["--auth-token", token], {}).auth_token == token
    assert draft_main.parse_config([], {}).auth_token is None
    config = coordinator_main.parse_config(["--draft", "d:1"], {"SPECDEC_COORDINATOR_DRAFT_AUTH_TOKEN": token})
    assert config.draft_auth_token == token and token not in repr(config)
    assert coordinator_main.parse_config(["--draft", "d:1", "--draft-auth-token", token], {}).draft_auth_token == token
    for parser in (
        coordinator_main._parser({"SPECDEC_COORDINATOR_DRAFT_AUTH_TOKEN": token}),
        draft_main._parser({"SPECDEC_DRAFT_AUTH_TOKEN": token}),
    ):
        assert token not in parser.format_help()
    assert token not in repr(draft_main.parse_config([], {"SPECDEC_DRAFT_AUTH_TOKEN": token}))
    assert token not in repr(DraftClientConfig(auth_token=token))


def _start_draft_server(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "specdec.draft_service", "--port", "0", "--metrics-port", "0"],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    line = process.stdout.readline().decode()
    assert " listening on " in line, line + process.stderr.read().decode()
    return process, line.rsplit(" ", 1)[-1].strip()


def test_draft_tier_token_refuses_calls_without_it_but_not_health_checks(tmp_path):
    """`specdec draft` with SPECDEC_DRAFT_AUTH_TOKEN: wrong or missing token UNAUTHENTICATED,
    health checks open, the right token served; the token is in none of its output or spans."""
    token = "tok-" + os.urandom(16).hex()
    trace_file = tmp_path / "spans.jsonl"
    process, address = _start_draft_server({"SPECDEC_DRAFT_AUTH_TOKEN": token, "SPECDEC_TRACE_FILE": str(trace_file)})
    try:
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 30
            while (
                health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
                != health_pb2.HealthCheckResponse.SERVING
            ):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            request = draft_pb2.ProposeRequest(session_id="s1", new_tokens=PROMPT, num_draft_tokens=3)
            for metadata in (
                (),
                (("authorization", "Bearer wrong"),),
                (("authorization", token),),
                (("authorization", f"Bearer {token}x"),),
            ):
                with pytest.raises(grpc.RpcError) as info:
                    stub.Propose(request, metadata=metadata, timeout=10)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
                assert token not in (info.value.details() or "")
            with pytest.raises(grpc.RpcError) as info:
                stub.EndSession(draft_pb2.EndSessionRequest(session_id="s1"), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

        async def through_the_client(auth_token):
            async with DraftClient(address, DraftClientConfig(auth_token=auth_token)) as client:
                proposal = await client.propose("s2", PROMPT, 3, SamplingParams())
                await client.end_session("s2")
                return proposal.token_ids

        assert asyncio.run(through_the_client(token))  # the n-gram drafter continues "5 17"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            asyncio.run(through_the_client(None))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err.decode()
    served_calls = [s["name"].rsplit("/", 1)[-1] for s in read_spans(trace_file) if s["kind"] == "SERVER"]
    assert served_calls == ["Propose", "EndSession"]  # a refused call opens no span
    for text in (out.decode(), err.decode(), trace_file.read_text()):
        assert token not in text


def test_no_token_prompt_or_text_in_the_coordinators_logs_or_spans(served, caplog):
    canary = "zq" * 5  # a prompt text that nothing else contains
    served.spans.clear()
    with caplog.at_level(logging.DEBUG):
        response = served.stub.Generate(
            pb.GenerateRequest(prompt=f"{canary} {canary} {canary}", max_new_tokens=12), timeout=30
        )
    assert response.speculation.draft_tokens > 0  # the draft tier answered: the token went on every call
    assert any(r.getMessage().startswith("request id=") for r in caplog.records)
    spans = served.spans.get_finished_spans()
    assert any(s.name == f"{SERVICE_NAME}/Generate" for s in spans)
    secrets_and_text = [served.draft_token, canary] + ([response.text] if len(response.text) >= 4 else [])
    logged = "\n".join(r.getMessage() for r in caplog.records)
    attributes = "\n".join(f"{k}={v}" for s in spans for k, v in (s.attributes or {}).items())
    for value in secrets_and_text:
        assert value not in logged and value not in attributes
