"""Prompt tokens of a chat, counted with the serving model's chat template: cached by content, and off the
GUI thread where the answer can wait (the context meter).

Tokenising a long chat takes tens of milliseconds; the meter asks only when the chat, the model or the
persona changes, and never twice for the same messages.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable

from engine import Chat

CACHE_SIZE = 64
Messages = list[dict] | Chat  # a Chat: the messages with the template options they are sent with


class TokenCounter:
    """``count(messages)`` now, or ``await count_later(messages)`` from a worker thread; both cached."""

    def __init__(self, count: Callable[[Messages], int]) -> None:
        self._count = count
        self._cache: OrderedDict[str, int] = OrderedDict()

    def count(self, messages: Messages) -> int:
        key = _key(messages)
        if key not in self._cache:
            self._remember(key, self._count(messages))
        self._cache.move_to_end(key)
        return self._cache[key]

    async def count_later(self, messages: Messages) -> int:
        key = _key(messages)
        if key not in self._cache:
            self._remember(key, await asyncio.to_thread(self._count, messages))
        return self._cache[key]

    def forget(self) -> None:
        """Another model (another tokenizer or template): every count is stale."""
        self._cache.clear()

    def _remember(self, key: str, value: int) -> None:
        self._cache[key] = value
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)


def _key(messages: Messages) -> str:
    """The cache key: the same messages with other template options are another prompt."""
    if isinstance(messages, Chat):
        return json.dumps([messages.messages, messages.options], ensure_ascii=False)
    return json.dumps(messages, ensure_ascii=False)
