"""The OpenAI-compatible HTTP API end to end, through the official `openai` client: a real draft
server, the target pool on the local Ray, tiny models, the coordinator's HTTP port on 127.0.0.1:0
beside its gRPC port. The same request gives the same tokens over either API; bad requests,
deadlines, overload and disconnects get OpenAI's errors and free both tiers' sessions."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx2 as httpx
import openai
import pytest
import ray
from loop_thread import LoopThread
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serving_kit import GatedEngine, HeldCleanupEngine, serving, until

from specdec.coordinator import metrics
from specdec.coordinator.clients import DraftClient
from specdec.coordinator.engine import Delta, EngineConfig
from specdec.coordinator.remote import connect_engine
from specdec.coordinator.server import GenerationServer, ServerConfig
from specdec.draft_service.server import DraftServer
from specdec.draft_service.service import DraftCore
from specdec.target_service.actor import ActorConfig
from specdec.target_service.pool import PoolConfig, TargetPool, launch
from specdec.v1 import common_pb2, generation_pb2_grpc
from specdec.v1 import generation_pb2 as pb

NAMESPACE, POOL = "specdec-test", "test-http"
TARGET_SEED = 1  # as in test_coordinator: a tiny target that neither stalls nor never repeats
PROMPT = "abcabcabd abcabc"
# A template of the test's own: the tiny models' tokenizer has none (as `--chat-template FILE` gives one).
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abcabc abcab"}]


class Stack:
    """One n-gram draft server, one target actor, and two coordinators over them: `chat` (a chat
    template, HTTP and gRPC) and `plain` (no template)."""

    def __init__(self, tiny_dir):
        self.loop = LoopThread()
        self.spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = provider.get_tracer("test")
        launch(ActorConfig(target_model=tiny_dir("llama", TARGET_SEED)), 1, prefix=POOL, namespace=NAMESPACE)
        self.pool = TargetPool(PoolConfig(prefix=POOL, namespace=NAMESPACE))
        self.actor = next(iter(self.pool.actors.values()))
        self.servers: dict[str, GenerationServer] = {}
        self.loop.run(self._start())
        chat = self.servers["chat"]
        self.grpc_channel = grpc.insecure_channel(f"127.0.0.1:{chat.port}")
        self.stub = generation_pb2_grpc.GenerationServiceStub(self.grpc_channel)
        self.base_url = f"http://127.0.0.1:{chat.http_port}"
        self.client = openai.OpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        self.plain = openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.servers['plain'].http_port}/v1", api_key="unused", max_retries=0
        )
        self.model = self.client.models.list().data[0].id

    async def _start(self) -> None:
        self.draft = DraftServer(DraftCore(None))
        port = await self.draft.start("127.0.0.1", 0)
        self.draft_client = DraftClient(f"127.0.0.1:{port}")
        for name, template in (("chat", TEMPLATE), ("plain", None)):
            config = EngineConfig(max_draft_tokens=8, adaptive=False, chat_template=template)
            engine = await connect_engine(self.draft_client, self.pool, None, config, self.tracer)
            server = GenerationServer(engine, ServerConfig(port=0, http_port=0, max_inflight=8), tracer=self.tracer)
            await server.start()
            self.servers[name] = server

    def sessions(self) -> tuple[int, int]:
        return len(self.draft.core.store), ray.get(self.actor.info.remote())["sessions"]

    def close(self) -> None:
        self.grpc_channel.close()
        self.client.close()
        self.plain.close()

        async def stop():
            for server in self.servers.values():
                await server.stop(0)
            await self.draft_client.close()
            await self.draft.stop(0)

        self.loop.run(stop())
        self.loop.close()
        ray.kill(self.actor, no_restart=True)


@pytest.fixture(scope="module")
def stack(ray_local, tiny_dir):
    s = Stack(tiny_dir)
    yield s
    s.close()


def _grpc(stack, **fields) -> pb.GenerateResponse:
    return stack.stub.Generate(pb.GenerateRequest(**fields), timeout=60)


# --- the same output as the gRPC API --------------------------------------------------------------------


def test_models_and_health(stack):
    models = stack.client.models.list().data
    assert [m.id for m in models] == [stack.servers["chat"].calls.model_name]
    assert httpx.get(stack.base_url + "/health").status_code == 200


def test_completion_equals_grpc_and_carries_usage_speculation_and_trace(stack):
    expected = _grpc(stack, prompt=PROMPT, max_new_tokens=24)
    stack.spans.clear()
    finished = metrics.REQUESTS.labels("length", "OK")
    before = finished._value.get()
    raw = stack.client.completions.with_raw_response.create(
        model=stack.model, prompt=PROMPT, max_tokens=24, temperature=0
    )
    completion = raw.parse()
    assert completion.choices[0].text == expected.text and completion.object == "text_completion"
    assert completion.choices[0].finish_reason == "length"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        expected.usage.prompt_tokens,
        len(expected.token_ids),
    )
    speculation = completion.model_extra["speculation"]
    assert speculation["rounds"] > 0 and speculation["draft_tokens"] > 0  # n-gram drafts were verified
    trace_id = raw.headers["x-trace-id"]

    def server_spans():
        return [s for s in stack.spans.get_finished_spans() if s.name == "POST /v1/completions"]

    until(lambda: server_spans())  # the span ends just after the response's last byte
    server = server_spans()
    assert len(server) == 1 and f"{server[0].context.trace_id:032x}" == trace_id
    assert server[0].attributes["http.response.status_code"] == 200
    rounds = [s for s in stack.spans.get_finished_spans() if s.parent and s.parent.span_id == server[0].context.span_id]
    assert len(rounds) == speculation["rounds"]  # the same round spans as a gRPC call's
    assert finished._value.get() == before + 1  # the same counters as gRPC's calls


def test_streamed_completion_concatenates_to_the_whole_one_and_ends_with_usage(stack):
    stats = stack.servers["chat"].stats
    failed, requests = stats.failed, stats.requests
    whole = stack.client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=24, temperature=0)
    chunks = list(
        stack.client.completions.create(
            model=stack.model,
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    until(lambda: stats.requests == requests + 2)
    assert stats.failed == failed  # a stream sent whole is a call that succeeded, its sessions ended
    until(lambda: stack.sessions() == (0, 0))
    body = {"prompt": PROMPT, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", stack.base_url + "/v1/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(line.startswith("data: {") for line in events[:-1])


def test_return_token_ids_streams_every_token_as_grpc_gives_them(stack):
    """vLLM's `return_token_ids` (and `ignore_eos`): each chunk's token ids, concatenated, are the
    whole response's and the gRPC call's, however the text was held back between chunks."""
    expected = list(_grpc(stack, prompt=PROMPT, max_new_tokens=24).token_ids)
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    whole = httpx.post(stack.base_url + "/v1/completions", json=body, timeout=30).json()
    assert whole["choices"][0]["token_ids"][: len(expected)] == expected
    assert len(whole["choices"][0]["token_ids"]) == whole["usage"]["completion_tokens"] == 24
    streamed = []
    with httpx.stream("POST", stack.base_url + "/v1/completions", json=body | {"stream": True}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                streamed += [t for c in json.loads(line[6:])["choices"] for t in c["token_ids"]]
    assert streamed == whole["choices"][0]["token_ids"]
    for name, value in (("ignore_eos", "yes"), ("return_token_ids", 1)):
        response = httpx.post(stack.base_url + "/v1/completions", json=body | {name: value}, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == name


def test_sampled_completion_with_a_seed_equals_grpc(stack):
    sampling = common_pb2.SamplingParams(temperature=0.8, top_p=0.9, seed=77)
    expected = _grpc(stack, prompt=PROMPT, max_new_tokens=20, sampling=sampling)
    got = stack.client.completions.create(
        model=stack.model, prompt=PROMPT, max_tokens=20, temperature=0.8, top_p=0.9, seed=77
    )
    assert got.choices[0].text == expected.text


def test_chat_equals_grpc_messages_whole_and_streamed(stack):
    messages = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in CHAT]
    expected = _grpc(stack, messages=messages, max_new_tokens=20)
    chat = stack.client.chat.completions.create(model=stack.model, messages=CHAT, max_tokens=20, temperature=0)
    assert chat.choices[0].message.content == expected.text and chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens == expected.usage.prompt_tokens
    # The template's text, tokenized: the prompt the gRPC API and the HTTP API both built.
    tokenizer = stack.servers["chat"].calls.engine.target.tokenizer
    rendered = "[system] be brief\n[user] abcabc abcab\n[assistant] "
    assert chat.usage.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    streamed = list(
        stack.client.chat.completions.create(
            model=stack.model, messages=CHAT, max_completion_tokens=20, temperature=0, stream=True
        )
    )
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected.text
    assert streamed[-1].choices[0].finish_reason == "length" and "speculation" in streamed[-1].model_extra


def test_speculation_object_turns_drafts_off_and_changes_no_token(stack):
    on = stack.client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=16, temperature=0)
    off = stack.client.completions.create(
        model=stack.model, prompt=PROMPT, max_tokens=16, temperature=0, extra_body={"speculation": {"disabled": True}}
    )
    assert off.choices[0].text == on.choices[0].text
    assert off.model_extra["speculation"]["draft_tokens"] == 0 and on.model_extra["speculation"]["draft_tokens"] > 0
    one = stack.client.completions.create(
        model=stack.model,
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        extra_body={"speculation": {"max_draft_tokens": 1}},
    )
    assert one.choices[0].text == on.choices[0].text
    assert max(len(one.model_extra["speculation"]["accepted_per_position"]), 1) == 1


def test_a_cache_affinity_key_changes_no_output(stack):
    plain = stack.client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=16, temperature=0)
    keyed = stack.client.completions.create(
        model=stack.model,
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        extra_body={"speculation": {"cache_affinity_key": "tenant-a/sql-agent"}},
    )
    assert keyed.choices[0].text == plain.choices[0].text
    assert keyed.model_extra["speculation"]["draft_tokens"] > 0  # it drafted, on the replica the key picks


# --- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"n": 2}, "n"),
        ({"extra_body": {"logprobs": 3}}, "logprobs"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 100000}, "max_tokens"),
        ({"seed": -3}, "seed"),
        ({"stop": ["x"] * 40}, "stop"),
        ({"extra_body": {"speculation": {"max_draft_tokens": 99}}}, "speculation.max_draft_tokens"),
        ({"extra_body": {"speculation": {"k": 2}}}, "speculation.k"),
        ({"extra_body": {"speculation": {"cache_affinity_key": 7}}}, "speculation.cache_affinity_key"),
        ({"extra_body": {"speculation": {"cache_affinity_key": "x" * 257}}}, "speculation.cache_affinity_key"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [1, 2, 100000]}, "prompt"),
    ],
)
def test_bad_completion_is_400_naming_the_parameter(stack, kwargs, param):
    kwargs = {"model": stack.model, "prompt": PROMPT, "max_tokens": 8, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        stack.client.completions.create(**kwargs)
    error = info.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert param in error["message"]


@pytest.mark.parametrize(
    "messages, param",
    [
        ([], "messages"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]"),
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": "hi", "tool_calls": [{"id": "1"}]}], "messages[0].tool_calls"),
    ],
)
def test_bad_chat_is_400_naming_the_parameter(stack, messages, param):
    with pytest.raises(openai.BadRequestError) as info:
        stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=4)
    assert info.value.body["param"] == param, info.value.body


def test_chat_without_a_template_names_messages_on_both_apis(stack):
    with pytest.raises(openai.BadRequestError) as info:
        stack.plain.chat.completions.create(model=stack.model, messages=CHAT, max_tokens=4)
    assert info.value.body["param"] == "messages" and "--chat-template" in info.value.body["message"]
    plain = stack.servers["plain"]
    with grpc.insecure_channel(f"127.0.0.1:{plain.port}") as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        request = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="hi")], max_new_tokens=4)
        with pytest.raises(grpc.RpcError) as rpc:
            stub.Generate(request, timeout=30)
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and rpc.value.details().startswith("messages: ")
    with pytest.raises(grpc.RpcError) as rpc:
        _grpc(stack, prompt="x", messages=[pb.ChatMessage(role="user", content="hi")], max_new_tokens=4)
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and rpc.value.details().startswith("prompt: ")


def test_unknown_model_is_404_and_bad_json_400(stack):
    with pytest.raises(openai.NotFoundError) as info:
        stack.client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)
    assert info.value.body["code"] == "model_not_found"
    response = httpx.post(stack.base_url + "/v1/completions", content=b"{not json", timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "body"
    response = httpx.post(
        stack.base_url + "/v1/completions",
        json={"prompt": PROMPT},
        headers={"x-request-timeout": "soon"},
        timeout=30,
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "x-request-timeout"


def test_deadline_is_504_and_frees_both_tiers(stack):
    response = httpx.post(
        stack.base_url + "/v1/completions",
        # One token a round: 200 rounds through Ray cannot all finish within the deadline.
        json={
            "prompt": PROMPT,
            "max_tokens": 200,
            "temperature": 0,
            "ignore_eos": True,
            "speculation": {"disabled": True},
        },
        headers={"x-request-timeout": "0.001"},
        timeout=30,
    )
    assert response.status_code == 504 and response.json()["error"]["type"] == "timeout_error"
    until(lambda: stack.servers["chat"].stats.in_flight == 0)
    until(lambda: stack.sessions() == (0, 0))


def test_disconnect_mid_stream_cancels_the_generation_and_frees_both_tiers(stack):
    stats = stack.servers["chat"].stats
    failed = stats.failed
    stream = stack.client.completions.create(
        model=stack.model,
        prompt=PROMPT,
        max_tokens=230,
        temperature=0,
        stream=True,
        extra_body={"speculation": {"disabled": True}},  # one token a round: many rounds to cut short
    )
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    stream.close()  # the connection closes with the generation unfinished
    until(lambda: stats.in_flight == 0)
    assert stats.failed == failed + 1  # cancelled, not run to its end
    until(lambda: stack.sessions() == (0, 0))


def test_beyond_max_inflight_is_429():
    engine = GatedEngine()
    with serving(engine, http_port=0, max_inflight=1) as (loop, server):
        with (
            openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="-", max_retries=0) as client,
            ThreadPoolExecutor(1) as pool,
        ):

            def streamed() -> list[str]:
                chunks = client.completions.create(model="gated", prompt="a", max_tokens=1, stream=True)
                return [c.choices[0].text for c in chunks]

            first = pool.submit(streamed)  # its headers come with its first token: after the release
            until(lambda: engine.entered == 1)
            with pytest.raises(openai.RateLimitError) as info:
                client.completions.create(model="gated", prompt="a", max_tokens=1)
            assert "max_inflight 1" in info.value.body["message"]
            loop.loop.call_soon_threadsafe(engine.release.set)
            assert first.result(timeout=30) == ["x"]
            assert client.completions.create(model="gated", prompt="a", max_tokens=1).choices[0].text == "x"


def test_a_request_leaves_max_inflight_as_its_last_chunk_is_sent():
    """The client reads the last chunk and opens its next request while the finished one still
    ends its sessions: with max_inflight 1 that next request is admitted, over HTTP and gRPC."""
    for transport in ("http", "grpc"):
        engine = HeldCleanupEngine()
        with serving(engine, http_port=0, max_inflight=1) as (loop, server):
            channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            base = f"http://127.0.0.1:{server.http_port}/v1/completions"
            body = {"prompt": "a", "max_tokens": 1, "stream": True}
            if transport == "http":
                with httpx.stream("POST", base, json=body, timeout=30) as r:
                    assert [line for line in r.iter_lines() if line][-1] == "data: [DONE]"
                first = None
            else:
                first = stub.GenerateStream(pb.GenerateStreamRequest(prompt="a", max_new_tokens=1), timeout=30)
                assert next(first).finish_reason == pb.FINISH_REASON_LENGTH  # the last chunk
            assert engine.cleaned == 0 and server.stats.in_flight == 0  # still cleaning up, not counted
            with httpx.stream("POST", base, json=body, timeout=30) as r:
                assert r.status_code == 200, r.read()
            second = list(stub.GenerateStream(pb.GenerateStreamRequest(prompt="a", max_new_tokens=1), timeout=30))
            assert [m.text for m in second] == ["x"]
            loop.loop.call_soon_threadsafe(engine.release.set)
            if first is not None:
                assert list(first) == []  # the first stream then ends OK
            until(lambda: engine.cleaned == engine.entered == 3)
            channel.close()


def test_a_client_holding_max_inflight_streams_is_never_refused(stack):
    """A closed loop of exactly max_inflight clients, each opening its next stream the moment the
    previous one ended, over HTTP and gRPC, speculation on and off: no request is refused, and
    every stream gives the same tokens."""
    server = stack.servers["chat"]
    clients, per_client = server.calls.max_inflight, 3
    failed = server.stats.failed
    expected = list(_grpc(stack, prompt=PROMPT, max_new_tokens=12).token_ids)

    def over_http(disabled: bool) -> list[int]:
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True, "return_token_ids": True}
        body["speculation"] = {"disabled": disabled}
        with httpx.stream("POST", stack.base_url + "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
        return [t for line in lines for c in json.loads(line[6:])["choices"] for t in c["token_ids"]]

    def over_grpc(disabled: bool) -> list[int]:
        request = pb.GenerateStreamRequest(
            prompt=PROMPT, max_new_tokens=12, speculation=pb.SpeculationParams(disabled=disabled)
        )
        return [t for m in stack.stub.GenerateStream(request, timeout=60) for t in m.token_ids]

    def closed_loop(send, disabled: bool) -> list[list[int]]:
        return [send(disabled) for _ in range(per_client)]

    for send in (over_http, over_grpc):
        for disabled in (False, True):
            with ThreadPoolExecutor(clients) as pool:
                runs = list(pool.map(lambda _: closed_loop(send, disabled), range(clients)))
            assert [tokens for run in runs for tokens in run] == [expected] * (clients * per_client)
    assert server.stats.failed == failed


class _FailingEngine:
    """Stands in for the engine: the target tier fails after `rounds` rounds."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self.target = type("Target", (), {"name": "failing", "max_context": 64})()

    async def stream(self, request):
        from specdec.target_service.pool import TargetUnavailable

        for _ in range(self.rounds):
            yield Delta([7], "x")
        raise TargetUnavailable("no actor answers")


def test_target_tier_down_is_503_before_the_first_token_and_an_error_event_after():
    with serving(_FailingEngine(0), http_port=0) as (_, down), serving(_FailingEngine(2), http_port=0) as (_, failing):
        before, after = (f"http://127.0.0.1:{s.http_port}" for s in (down, failing))
        response = httpx.post(before + "/v1/completions", json={"prompt": "a", "stream": True}, timeout=30)
        assert response.status_code == 503 and response.json()["error"]["type"] == "service_unavailable_error"
        with openai.OpenAI(base_url=after + "/v1", api_key="-", max_retries=0) as client:
            texts = []
            with pytest.raises(openai.APIError) as info:
                for chunk in client.completions.create(model="failing", prompt="a", stream=True):
                    texts.append(chunk.choices[0].text)
            assert texts == ["x", "x"] and "target tier" in info.value.message


def test_connections_send_without_nagle_delay():
    """A response goes out in two writes (head, body): on a kept-alive connection without
    TCP_NODELAY the second waits for the client's delayed ACK, 40 ms a request."""
    import socket

    engine = GatedEngine()
    engine.release.set()
    with serving(engine, http_port=0) as (_, server):
        with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            for _ in range(2):  # the same kept-alive connection twice
                assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 200
            connections = server.http._server.server_state.connections
            assert connections
            for connection in connections:
                sock = connection.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
