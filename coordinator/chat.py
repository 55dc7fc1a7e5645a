"""Conversations -> prompt tokens, through a chat template.

The template is the server's `--chat-template` when given, else the target tokenizer's own; a
model with neither refuses conversations (INVALID_ARGUMENT on `messages`) rather than guessing a
format the model was never trained on. The rendered text carries the template's own special
tokens (BOS included), so it is tokenized without adding any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from specdec.core.errors import InvalidArgument

# The roles OpenAI's chat API defines; a template maps them onto its model's own names.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


class ChatTemplate:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, template: str | None = None):
        self.tokenizer = tokenizer
        self.template = template or getattr(tokenizer, "chat_template", None) or None

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The conversation as the model reads it, ending with the prompt for the assistant's turn."""
        if self.template is None:
            raise InvalidArgument(
                "messages",
                "the target model has no chat template: start the coordinator with --chat-template FILE, "
                "or send prompt text",
            )
        for i, m in enumerate(messages):
            if not isinstance(m.role, str) or m.role not in ROLES:
                roles = ", ".join(sorted(ROLES))
                raise InvalidArgument(f"messages[{i}].role", f"must be one of {roles}, got {m.role!r}")
            if not isinstance(m.content, str):
                raise InvalidArgument(f"messages[{i}].content", "must be a string")
        try:
            return self.tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in messages],
                chat_template=self.template,
                add_generation_prompt=True,
                tokenize=False,
            )
        except TemplateError as e:  # the template's own checks (`raise_exception`): alternating roles, ...
            raise InvalidArgument("messages", f"the chat template refused them: {e}") from e

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
