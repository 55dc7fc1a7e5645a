"""A draft replica as a server and a process: health, reflection, graceful drain, SIGTERM, flags
and environment, and replica affinity across several replicas (rendezvous hashing, dns targets)."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import urllib.request

import grpc
import pytest
from draft_kit import (
    DRAFT_SEED,
    NEW_TOKENS,
    PROMPT,
    REPO,
    TARGET_SEED,
    gate,
    propose_request,
    run,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from specdec.coordinator.clients import DraftClient, DraftClientConfig, pick_replica
from specdec.coordinator.engine import EngineConfig, GenerationRequest, SpeculativeEngine
from specdec.core.sampling import SamplingParams
from specdec.draft_service.__main__ import parse_config
from specdec.draft_service.server import SERVICE_NAME, DraftServer
from specdec.draft_service.service import DraftCore
from specdec.local.in_process import LocalVerifier
from specdec.target_service.verifier import TargetVerifier
from specdec.v1 import draft_pb2_grpc

# --- health, reflection, draining, the process -----------------------------------------------------


async def _health(channel, service: str = "") -> int:
    return (
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    ).status


def test_health_reflection_and_graceful_drain(tiny):
    async def check():
        server = DraftServer()  # no model yet: loading
        port = await server.start("127.0.0.1", 0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            assert await _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Propose(propose_request(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            await server.set_core(DraftCore(tiny("llama", DRAFT_SEED)))
            for service in ("", SERVICE_NAME):
                assert await _health(channel, service) == health_pb2.HealthCheckResponse.SERVING

            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            names = {s.name async for r in responses for s in r.list_services_response.service}
            assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names

            entered, release = gate(server.core)
            in_flight = asyncio.ensure_future(stub.Propose(propose_request("a"), timeout=30))
            assert await asyncio.to_thread(entered.wait, 10)
            await server.begin_drain()
            assert await _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Propose(propose_request("b"), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            stopping = asyncio.ensure_future(server.stop(30))
            release.set()
            assert len((await in_flight).token_ids) == 4  # the call in flight finished
            await stopping

    run(check())


def test_process_serves_and_exits_cleanly_on_sigterm():
    env = dict(os.environ, SPECDEC_DRAFT_PORT="0", SPECDEC_DRAFT_METRICS_PORT="0", SPECDEC_DRAFT_GRACE="5")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdec.draft_service", "--draft-model", "ngram"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert select.select([proc.stdout], [], [], 30)[0], "no output within 30 s"
        line = proc.stdout.readline()  # printed once it listens (the model loads after)
        assert "listening on 127.0.0.1:" in line, line
        address = line.rsplit(" ", 1)[-1].strip()
        metrics_line = proc.stdout.readline()
        assert "metrics on 127.0.0.1:" in metrics_line, metrics_line
        metrics_address = metrics_line.rsplit(" ", 1)[-1].strip()

        async def check():
            async with grpc.aio.insecure_channel(address) as channel:
                await until_serving(channel)
                response = await draft_pb2_grpc.DraftServiceStub(channel).Propose(propose_request(), timeout=5)
                assert list(response.token_ids) == [42, 120, 33, 64]  # prompt lookup after "5 17"

        run(check(), 30)
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as reply:
            page = reply.read().decode()
        assert 'specdec:draft_propose_calls_total{code="OK"} 1.0' in page
        assert "specdec:draft_tokens_total 4.0" in page and "specdec:draft_sessions 1.0" in page
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def until_serving(channel) -> None:
    async with asyncio.timeout(20):
        while await _health(channel) != health_pb2.HealthCheckResponse.SERVING:
            await asyncio.sleep(0.01)  # the model loads in the background


def test_flags_and_environment_map_onto_the_config():
    config = parse_config(
        ["--max-batch", "8"],
        {"SPECDEC_DRAFT_MAX_BATCH": "4", "SPECDEC_DRAFT_SESSION_TTL": "0", "SPECDEC_DRAFT_PORT": "0"},
    )
    assert config.draft.max_batch == 8  # the flag wins over the environment
    assert config.port == 0 and config.draft.session_ttl_s is None and config.draft_model == "ngram"
    assert parse_config([], {}).port == 50052
    assert parse_config([], {"SPECDEC_DRAFT_SUFFIX_CACHE_TOKENS": "4096"}).suffix.max_cached_tokens == 4096
    for argv, env in ((["--max-queue", "0"], {}), ([], {"SPECDEC_DRAFT_PORT": "70000"}), (["--grace", "-1"], {})):
        with pytest.raises(SystemExit):
            parse_config(argv, env)


# --- replica affinity -----------------------------------------------------------------------------


def test_rendezvous_hashing_is_stable_spreads_and_moves_only_the_removed_replicas_sessions():
    replicas = [f"10.0.0.{i}:50052" for i in range(4)]
    sessions = [f"session-{i}" for i in range(400)]
    placed = {s: pick_replica(s, replicas) for s in sessions}
    counts = [list(placed.values()).count(r) for r in replicas]
    assert min(counts) > 60  # 100 each on average
    assert all(pick_replica(s, list(reversed(replicas))) == placed[s] for s in sessions)  # order-free
    moved = [s for s in sessions if pick_replica(s, replicas[:3]) != placed[s]]
    assert moved and all(placed[s] == replicas[3] for s in moved)


def test_dns_target_resolves_to_every_replica_and_keeps_sessions_on_one(tiny, monkeypatch):
    async def check():
        first = DraftServer(DraftCore(None))
        port = await first.start("127.0.0.1", 0)
        second = DraftServer(DraftCore(None))
        await second.start("127.0.0.2", port)  # all of 127/8 is loopback: two "pods", one port
        real = socket.getaddrinfo

        def fake(host, *args, **kwargs):  # the resolver of a headless service with two pods
            if host == "drafts.test":
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ("127.0.0.1", "127.0.0.2")]
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", fake)
        client = DraftClient(f"dns:///drafts.test:{port}")
        try:
            for round_ in range(3):
                for i in range(12):
                    tokens = PROMPT + list(range(round_ + 1))
                    await client.propose(f"s{i}", tokens, 3, SamplingParams())
            held = [set(server.core.store) for server in (first, second)]
            assert held[0] and held[1] and not held[0] & held[1]  # spread, and each session on one replica
            assert held[0] | held[1] == {f"s{i}" for i in range(12)}
            assert client.misses == 0 and first.core.stats.calls + second.core.stats.calls == 36
        finally:
            await client.close()
            await first.stop(0)
            await second.stop(0)

    run(check())


def test_a_cache_affinity_key_sends_every_request_of_a_kind_to_one_replica():
    """Sessions spread over two replicas by session id; with one affinity key they all draft on
    the replica the key picks, so its suffix cache sees each of them."""

    async def check():
        servers = [DraftServer(DraftCore(None)) for _ in range(2)]
        addresses = [f"127.0.0.1:{await server.start('127.0.0.1', 0)}" for server in servers]
        client = DraftClient(addresses)
        try:
            for i in range(24):  # the ports differ each run: all 24 on one replica has odds 2^-23
                await client.propose(f"spread-{i}", PROMPT, 3, SamplingParams())
            for i in range(8):
                await client.propose(f"kind-{i}", PROMPT, 3, SamplingParams(), affinity="agent-loop")
            held = [set(server.core.store) for server in servers]
            keyed = [{s for s in h if s.startswith("kind-")} for h in held]
            assert all(any(s.startswith("spread-") for s in h) for h in held)  # by session: both replicas
            chosen = addresses.index(pick_replica("agent-loop", addresses))
            assert keyed[chosen] == {f"kind-{i}" for i in range(8)} and not keyed[1 - chosen]
            for i in range(8):
                await client.end_session(f"kind-{i}")
            assert not any(s.startswith("kind-") for server in servers for s in server.core.store)
        finally:
            await client.close()
            for server in servers:
                await server.stop(0)

    run(check())


def test_a_dead_replicas_sessions_fail_over_to_the_next_ranked_and_come_back_with_its_health(tiny):
    target = tiny("llama", TARGET_SEED)
    config = EngineConfig(max_draft_tokens=8, pipeline=False, adaptive=False)
    requests = [
        GenerationRequest(prompt_token_ids=[60 + i, *PROMPT], max_new_tokens=NEW_TOKENS, max_draft_tokens=4)
        for i in range(6)
    ]

    async def check():
        servers = [DraftServer(DraftCore(None)) for _ in range(2)]
        ports = [await server.start("127.0.0.1", 0) for server in servers]
        addresses = [f"127.0.0.1:{port}" for port in ports]
        client = DraftClient(addresses, DraftClientConfig(health_every_s=0.05))
        engine = SpeculativeEngine(client, LocalVerifier(TargetVerifier(target)), target, config)
        try:
            expected = [(await engine.generate(r)).token_ids for r in requests]  # both replicas up
            first = pick_replica("s", addresses)
            dead = addresses.index(first)
            await client.propose("s", PROMPT, 3, SamplingParams())
            assert "s" in servers[dead].core.store
            await servers[dead].stop(0)
            # The call finds its replica gone and goes to the other one at once, with the context.
            longer = [*PROMPT, 5, 17]
            assert await client.propose("s", longer, 3, SamplingParams())
            assert "s" in servers[1 - dead].core.store
            # Every request drafts on the live replica: no round without drafts, the same tokens.
            results = [await engine.generate(r) for r in requests]
            assert [r.token_ids for r in results] == expected
            assert sum(r.stats.draft_failures for r in results) == 0
            assert sum(r.stats.draft_tokens for r in results) > 0
            # Back on its port: SERVING again, so its sessions return to it (a miss, a resend).
            servers[dead] = DraftServer(DraftCore(None))
            await servers[dead].start("127.0.0.1", ports[dead])
            async with asyncio.timeout(10):
                while addresses[dead] in client._down:
                    await asyncio.sleep(0.05)
            await client.propose("s", [*longer, 42], 3, SamplingParams())
            assert "s" in servers[dead].core.store
        finally:
            await client.close()
            for server in servers:
                await server.stop(0)

    run(check())
