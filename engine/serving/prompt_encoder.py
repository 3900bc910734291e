"""Prompts to token ids: checked, capped, templated in the sandbox and tokenised, before the engine thread.

A prompt is raw text, token ids, chat messages, or a :class:`Chat` (messages with options for the template).
Everything that can take long (the chat template, tokenising megabytes) happens here, on the caller's thread, so
one huge or hostile prompt never stalls the other streams.
Text longer than the context could hold is refused before any work: no token is longer than the vocabulary's
longest entry, so text with more characters than ``max_model_len`` times that length has more tokens than fit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import PromptTooLong
from ..templates.chat_template import ChatTemplate
from ..templates.sandbox import TemplateSandbox, TemplateTooLong
from ..templates.tool_calls import renders_tools
from ..templates.tool_prompt import with_mapping_arguments, with_tool_prompt

# what a template's own variables are called: an option cannot take their place (tools come as Chat.tools)
TEMPLATE_NAMES = frozenset({"messages", "add_generation_prompt", "continue_final_message", "tools", "documents"})


@dataclass(frozen=True, slots=True)
class Chat:
    """Chat messages and the variables the model's chat template is rendered with besides them, such as
    ``{"enable_thinking": False}`` for a template that can be asked not to think (what vLLM and llama-server call
    ``chat_template_kwargs``). An assistant message may carry its ``reasoning_content``: the template decides
    whether the model sees it again; and its ``tool_calls`` (OpenAI's shape), answered by ``tool`` messages.
    ``tools``: the functions the model may call (OpenAI's ``tools`` list), laid out by the template where it
    knows tools, else described in a default tool prompt (:mod:`engine.templates.tool_prompt`)."""

    messages: list[dict]
    options: dict = field(default_factory=dict)
    tools: list[dict] = field(default_factory=list)


Prompt = str | list[int] | list[dict] | Chat


class PromptEncoder:
    """The one place a prompt becomes token ids; safe to use from any thread (tokenizers encode without a lock)."""

    def __init__(self, tokenizer, max_model_len: int, vocab_size: int, sandbox: TemplateSandbox | None = None):
        self.tokenizer = tokenizer
        self.template = ChatTemplate(tokenizer, sandbox)
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.max_chars = max_model_len * max(1, max(map(len, tokenizer.get_vocab()), default=1))
        self.max_messages = max_model_len  # every message takes at least one token of the context

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of ``prompt``; ``ValueError`` saying what is wrong (``TemplateError`` from the template)."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(self._checked_text(prompt), add_special_tokens=True)
        elif isinstance(prompt, Chat):
            if not prompt.messages:
                raise ValueError("a chat needs at least one message")
            ids = self.tokenizer.encode(self._render_chat(prompt), add_special_tokens=False)
        elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            ids = self.tokenizer.encode(self._render(list(prompt)), add_special_tokens=False)
        elif isinstance(prompt, (list, tuple)) and all(is_token_id(t) for t in prompt):
            ids = [int(t) for t in prompt]
        else:
            raise ValueError("a prompt is a string, a list of token ids, a list of chat messages or a Chat")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"prompt token ids must lie in [0, {self.vocab_size})")
        return list(ids)

    def _checked_text(self, text: str) -> str:
        valid_text(text, "the prompt")
        if len(text) > self.max_chars:
            raise PromptTooLong(f"the prompt is {len(text):,} characters: {self._too_long}")
        return text

    def _render_chat(self, chat: Chat) -> str:
        options, messages, tools = checked_options(chat.options), list(chat.messages), None
        uses_tools = chat.tools or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)
        if uses_tools and renders_tools(self.template.source):
            messages, tools = with_mapping_arguments(messages), list(chat.tools) or None
        elif uses_tools:
            messages = with_tool_prompt(messages, list(chat.tools))
        return self._render(messages, options, tools)

    def _render(self, messages: list[dict], options: dict | None = None, tools: list[dict] | None = None) -> str:
        if len(messages) > self.max_messages:
            raise PromptTooLong(f"the chat has {len(messages):,} messages, more than the model's "
                             f"{self.max_model_len:,}-token context can hold")
        for index, message in enumerate(messages):
            if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                raise ValueError(f"chat message {index} needs a 'role' and a 'content' that are strings")
            valid_text(message["content"], f"chat message {index}")
            if not isinstance(message.get("reasoning_content", ""), str):
                raise ValueError(f"chat message {index}'s 'reasoning_content' must be a string")
        chars = sum(len(m["content"]) for m in messages)
        if chars > self.max_chars:
            raise PromptTooLong(f"the messages are {chars:,} characters: {self._too_long}")
        try:
            return self.template.render(messages, self.max_chars, options, tools)
        except TemplateTooLong as exc:
            raise PromptTooLong(f"the chat, once the model's template has laid it out, is {exc.chars:,} characters: "
                             f"{self._too_long}") from None

    @property
    def _too_long(self) -> str:
        return f"more than the model's {self.max_model_len:,}-token context can hold (at most {self.max_chars:,})"


def checked_options(options) -> dict:
    """``options`` for a chat template, or ``ValueError`` saying why not: names that are identifiers and not the
    template's own variables, values that JSON can carry."""
    if not isinstance(options, dict):
        raise ValueError(f"chat template options must be a mapping, not {type(options).__name__}")
    for name in options:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"chat template option {name!r} is not a name a template can use")
        if name in TEMPLATE_NAMES:
            raise ValueError(f"chat template option {name!r} is the template's own variable")
    try:
        json.dumps(options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"chat template options must be text, numbers, lists or mappings: {exc}") from None
    return options


def is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def valid_text(text: str, what: str) -> str:
    """``text`` unchanged, or a ``ValueError`` if it holds a lone surrogate (not encodable Unicode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode (a lone surrogate at character {exc.start})") from None
    return text
