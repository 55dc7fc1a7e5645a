"""OpenAI's completions and chat completions bodies <-> the engine's requests and deltas.

Parsing names the parameter at fault, as OpenAI's own errors do (`param`). A parameter the
engine has no counterpart for is refused by name unless it has its neutral value (a penalty of
0, `n` of 1, `logprobs` false, ...), which many clients send on every request; metadata that
changes no token (`user`, `metadata`, ...) is accepted and ignored. Defaults are OpenAI's:
temperature 1, top_p 1, `max_tokens` 16 for completions and the rest of the context for chat.
The engine's own field names (`max_new_tokens`, `sampling.temperature`, ...) are translated back
to the request's in `http_param`, so a refusal names what the client sent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from specdec.coordinator.chat import ChatMessage
from specdec.coordinator.convert import response_to_proto
from specdec.coordinator.engine import Delta, GenerationRequest
from specdec.core.errors import InvalidArgument
from specdec.core.sampling import SamplingParams

COMPLETIONS, CHAT = "text_completion", "chat.completion"

# Parameters that change nothing the engine does: accepted with any value.
_METADATA = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key", "service_tier", "store"})
# Parameters the engine cannot honour, accepted only with the value that means "off".
_NEUTRAL: dict[str, tuple] = {
    "n": (1,),
    "best_of": (1,),
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "logit_bias": ({},),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "echo": (False,),
    "suffix": ("",),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "function_call": ("none",),
    "parallel_tool_calls": (True, False),  # meaningless without tools
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
}
_COMMON = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "speculation",
        "ignore_eos",
        "return_token_ids",
    }
)
_KNOWN = {
    COMPLETIONS: _COMMON | {"prompt", "max_tokens"},
    CHAT: _COMMON | {"messages", "max_tokens", "max_completion_tokens"},
}


class ModelNotFound(Exception):
    """The request names a model this server does not serve (HTTP 404)."""


@dataclass
class HttpRequest:
    """A parsed body: what to generate, and how to answer."""

    kind: str  # COMPLETIONS or CHAT
    generation: GenerationRequest
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    return_token_ids: bool = False  # vLLM's extension: each choice also carries its token ids
    params: dict[str, str] = field(default_factory=dict)  # engine field -> the request's name for it

    def http_param(self, engine_field: str) -> str:
        """The request's name for an engine field (`max_new_tokens` -> `max_tokens`, ...)."""
        head, _, rest = engine_field.partition("[")
        name = self.params.get(head, head)
        return name + ("[" + rest if rest else "")


def parse(kind: str, body: Any, served_model: str) -> HttpRequest:
    """The body of POST /v1/completions (kind COMPLETIONS) or /v1/chat/completions (CHAT)."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    for name, value in body.items():
        if name in _KNOWN[kind] or name in _METADATA or value is None:
            continue
        if name in _NEUTRAL:
            if value not in _NEUTRAL[name]:
                raise InvalidArgument(
                    name, f"is not supported by this server (only {_NEUTRAL[name][0]!r}), got {value!r}"
                )
            continue
        raise InvalidArgument(name, "is not a parameter this server knows")
    model = body.get("model")
    if model is not None and model != served_model:
        raise ModelNotFound(f"model {model!r} is not served here; this server serves {served_model!r}")
    stream = _typed(body, "stream", bool, False)
    options = _typed(body, "stream_options", dict, None)
    include_usage = False
    if options is not None:
        if not stream:
            raise InvalidArgument("stream_options", "is allowed only with stream: true")
        unknown = set(options) - {"include_usage"}
        if unknown:
            raise InvalidArgument(f"stream_options.{min(unknown)}", "is not a stream option this server knows")
        include_usage = _typed(options, "include_usage", bool, False, prefix="stream_options.")
    params = {f"sampling.{name}": name for name in ("temperature", "top_p", "top_k", "seed")}
    generation = GenerationRequest(
        sampling=SamplingParams(
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            top_k=_typed(body, "top_k", int, 0),
            seed=_typed(body, "seed", int, None),
        ),
        stop=_stop(body.get("stop")),
        ignore_eos=_typed(body, "ignore_eos", bool, False),
    )
    _speculation(body.get("speculation"), generation)
    if kind == COMPLETIONS:
        _completion_prompt(body.get("prompt"), generation)
        generation.max_new_tokens = _typed(body, "max_tokens", int, 16)
        params.update({"prompt_token_ids": "prompt", "max_new_tokens": "max_tokens"})
    else:
        generation.messages = _messages(body.get("messages"))
        generation.max_new_tokens, name = _max_completion_tokens(body)
        params.update({"prompt": "messages", "max_new_tokens": name})
    return_ids = _typed(body, "return_token_ids", bool, False)
    return HttpRequest(kind, generation, stream, include_usage, params=params, return_token_ids=return_ids)


def _typed(body: dict, name: str, kind: type, default, prefix: str = ""):
    value = body.get(name)
    if value is None:
        return default
    # bool is an int in Python, never in JSON's sense here.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidArgument(prefix + name, f"must be {_TYPE_NAMES[kind]}, got {json.dumps(value)[:40]}")
    return value


_TYPE_NAMES = {bool: "true or false", int: "an integer", dict: "an object", str: "a string", list: "an array"}


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(name, f"must be a number, got {json.dumps(value)[:40]}")
    return float(value)


def _stop(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise InvalidArgument("stop", "must be a string or an array of strings")


def _speculation(value, generation: GenerationRequest) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidArgument("speculation", "must be an object: {disabled, max_draft_tokens, cache_affinity_key}")
    unknown = set(value) - {"disabled", "max_draft_tokens", "cache_affinity_key"}
    if unknown:
        raise InvalidArgument(
            f"speculation.{min(unknown)}",
            "is not a speculation setting (disabled, max_draft_tokens, cache_affinity_key)",
        )
    generation.speculate = not _typed(value, "disabled", bool, False, prefix="speculation.")
    generation.max_draft_tokens = _typed(value, "max_draft_tokens", int, 0, prefix="speculation.")
    generation.cache_affinity_key = _typed(value, "cache_affinity_key", str, "", prefix="speculation.")


def _completion_prompt(value, generation: GenerationRequest) -> None:
    """A string, an array of token ids, or an array holding one of those (one prompt a request)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        generation.prompt = value
        if not value:
            raise InvalidArgument("prompt", "is empty")
    elif isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        generation.prompt_token_ids = value
    elif value is None:
        raise InvalidArgument("prompt", "is required")
    else:
        raise InvalidArgument("prompt", "must be a string or an array of token ids (one prompt per request)")


def _messages(value) -> list[ChatMessage]:
    if value is None:
        raise InvalidArgument("messages", "is required")
    if not isinstance(value, list) or not value:
        raise InvalidArgument("messages", "must be a non-empty array of {role, content}")
    messages = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidArgument(where, "must be an object {role, content}")
        for name, part in m.items():
            if name not in ("role", "content", "name") and part is not None:
                raise InvalidArgument(f"{where}.{name}", "is not supported by this server (text messages only)")
        role = m.get("role")
        if not isinstance(role, str):
            raise InvalidArgument(f"{where}.role", "must be a string")
        messages.append(ChatMessage(role, _content(m.get("content"), where)))
    return messages


def _content(value, where: str) -> str:
    """A message's text: a string, or an array of text parts joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidArgument(f"{where}.content[{j}]", "only text parts {type: text, text} are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidArgument(f"{where}.content", "must be a string or an array of text parts")


def _max_completion_tokens(body: dict) -> tuple[int | None, str]:
    """Chat's limit: max_completion_tokens, or the older max_tokens; None (unset) is the context's rest."""
    new = _typed(body, "max_completion_tokens", int, None)
    old = _typed(body, "max_tokens", int, None)
    if new is not None and old is not None and new != old:
        raise InvalidArgument("max_tokens", f"differs from max_completion_tokens ({old} != {new}): give one")
    return (new, "max_completion_tokens") if new is not None else (old, "max_tokens")


# -- responses ---------------------------------------------------------------------------------


@dataclass
class Reply:
    """The fields every response and chunk of one request shares."""

    kind: str
    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    return_token_ids: bool = False  # each choice carries `token_ids` (a chunk's: its delta's)

    def chunk(self, delta: Delta | None, first: bool = False) -> dict:
        """One streamed chunk: `delta`'s text (the chat stream's first chunk names the role)."""
        text = delta.text if delta is not None else ""
        finish = delta.finish_reason.value if delta is not None and delta.finish_reason is not None else None
        if self.kind == CHAT:
            choice = {"index": 0, "delta": {"role": "assistant", "content": text} if first else {"content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update({"logprobs": None, "finish_reason": finish})
        if self.return_token_ids:
            choice["token_ids"] = list(delta.token_ids) if delta is not None else []
        out = self._chunk_head([choice])
        if finish is not None:
            out["speculation"] = speculation(delta)
        return out

    def usage_chunk(self, delta: Delta, completion_tokens: int) -> dict:
        """stream_options.include_usage: the last chunk, no choices, the request's usage."""
        out = self._chunk_head([])
        out["usage"] = usage(delta.prompt_tokens, completion_tokens)
        return out

    def _chunk_head(self, choices: list) -> dict:
        # A chat stream's chunks are `chat.completion.chunk`; a completions stream's, like its
        # whole response, `text_completion`.
        kind = f"{CHAT}.chunk" if self.kind == CHAT else self.kind
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, final: Delta) -> dict:
        """The non-streamed response: `final` holds the whole output (as `engine.generate` gives)."""
        if self.kind == CHAT:
            choice = {"index": 0, "message": {"role": "assistant", "content": final.text}}
        else:
            choice = {"index": 0, "text": final.text}
        choice.update({"logprobs": None, "finish_reason": final.finish_reason.value})
        if self.return_token_ids:
            choice["token_ids"] = list(final.token_ids)
        return {
            "id": self.id,
            "object": self.kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(final.prompt_tokens, len(final.token_ids)),
            "speculation": speculation(final),
        }


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def speculation(final: Delta) -> dict:
    """The round statistics, with the gRPC API's field names (`SpeculationStats`)."""
    return json_format.MessageToDict(
        response_to_proto(final).speculation,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error JSON."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
