"""Request validation: every field of a request checked, and its prompt tokenized, before its
first round.

A bad field is refused with `InvalidArgument` naming it (the public APIs answer
INVALID_ARGUMENT, or HTTP 400, with that name), the first bad one only. A check that bounds work
runs before the work: a text too long for the model's context is refused before it is
tokenized, a token-id list longer than the context before its ids are scanned. Stop strings are
bounded in number and length because every round searches the new text for each of them
(coordinator/text.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from transformers import PreTrainedTokenizerBase

from specdec.coordinator.chat import ChatMessage, ChatTemplate
from specdec.core.errors import InvalidArgument
from specdec.core.sampling import SamplingParams

MAX_AFFINITY_KEY_BYTES = 256  # a cache-affinity key names a kind of request, it carries no content


class RequestFields(Protocol):
    """The fields validation reads (`GenerationRequest` has them)."""

    prompt: str
    prompt_token_ids: list[int]
    messages: Sequence[ChatMessage]
    max_new_tokens: int | None
    sampling: SamplingParams
    stop: Sequence[str]
    max_draft_tokens: int
    cache_affinity_key: str


class RequestLimits(Protocol):
    """The engine settings validation reads (`EngineConfig` has them)."""

    max_draft_tokens: int
    max_stop_strings: int
    max_stop_chars: int


class PromptTarget(Protocol):
    """What validation must know of the target model (a `LoadedModel` fits)."""

    tokenizer: PreTrainedTokenizerBase
    vocab_size: int
    max_context: int


class ValidRequest(NamedTuple):
    prompt: list[int]  # the prompt's token ids, shorter than the model's context
    max_new_tokens: int  # the request's, or all the room the context leaves where it asked for None


class RequestValidator:
    """Checks requests against one target model and the engine's limits."""

    def __init__(self, target: PromptTarget, limits: RequestLimits, chat: ChatTemplate):
        self.target = target
        self.limits = limits
        self.chat = chat  # renders `messages`
        self._longest_token: int | None = None  # characters of the longest vocabulary entry, once needed

    def check(self, request: RequestFields) -> ValidRequest:
        """The request's prompt as token ids and its output bound; InvalidArgument names the first
        bad field."""
        prompt = self._prompt(request)
        room = self.target.max_context - len(prompt)
        max_new_tokens = room if request.max_new_tokens is None else request.max_new_tokens
        if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= room:
            raise InvalidArgument("max_new_tokens", f"must be in [1, {room}] for this prompt, got {max_new_tokens!r}")
        request.sampling.validate()
        self._check_stop(request.stop)
        limit = self.limits.max_draft_tokens
        if not isinstance(request.max_draft_tokens, int) or not 0 <= request.max_draft_tokens <= limit:
            raise InvalidArgument(
                "speculation.max_draft_tokens", f"must be in [0, {limit}], got {request.max_draft_tokens!r}"
            )
        key = request.cache_affinity_key
        if not isinstance(key, str) or len(key.encode()) > MAX_AFFINITY_KEY_BYTES:
            raise InvalidArgument(
                "speculation.cache_affinity_key", f"must be a string of at most {MAX_AFFINITY_KEY_BYTES} bytes"
            )
        return ValidRequest(prompt, max_new_tokens)

    def _prompt(self, request: RequestFields) -> list[int]:
        """Exactly one of prompt, prompt_token_ids and messages, as token ids that leave room in
        the context for at least one new token."""
        given = [name for name in ("prompt", "prompt_token_ids", "messages") if getattr(request, name)]
        if len(given) > 1:
            raise InvalidArgument(given[0], f"give prompt or prompt_token_ids or messages, not {' and '.join(given)}")
        max_context = self.target.max_context
        if request.prompt or request.messages:
            field_name = "messages" if request.messages else "prompt"
            text = self.chat.render(request.messages) if request.messages else request.prompt
            # Refused before tokenizing, whose cost grows with the text: no token covers more
            # characters than its own entry in the vocabulary, so a longer text cannot fit.
            if len(text) > max_context and len(text) > max_context * self._longest():
                raise InvalidArgument(
                    field_name,
                    f"has {len(text)} characters, more than the model's context of {max_context} tokens can hold",
                )
            prompt = self.chat.encode(text) if request.messages else self.target.tokenizer(text)["input_ids"]
        else:
            prompt = list(request.prompt_token_ids)
            if max_context <= len(prompt):
                raise InvalidArgument(
                    "prompt", f"has {len(prompt)} tokens; the model's context is {max_context}"
                )  # before scanning millions of ids
            bad = [t for t in prompt if not 0 <= t < self.target.vocab_size]
            if bad:
                raise InvalidArgument("prompt_token_ids", f"token id {bad[0]} is outside [0, {self.target.vocab_size})")
        if not prompt:
            raise InvalidArgument("prompt", "is empty")
        if len(prompt) >= max_context:
            raise InvalidArgument("prompt", f"has {len(prompt)} tokens; the model's context is {max_context}")
        return prompt

    def _check_stop(self, stop: Sequence[str]) -> None:
        if any(not isinstance(s, str) for s in stop):
            raise InvalidArgument("stop", "must be strings")
        if len(stop) > self.limits.max_stop_strings:
            raise InvalidArgument("stop", f"at most {self.limits.max_stop_strings} strings, got {len(stop)}")
        if (longest := max(map(len, stop), default=0)) > self.limits.max_stop_chars:
            raise InvalidArgument("stop", f"each at most {self.limits.max_stop_chars} characters, got {longest}")

    def _longest(self) -> int:
        if self._longest_token is None:
            self._longest_token = max(map(len, self.target.tokenizer.get_vocab()), default=1)
        return self._longest_token
