"""Response bodies and stream chunks in OpenAI's shape, for chat and for plain completions."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ..serving.outputs import RequestOutput

FINISH_REASONS = {"stop": "stop", "length": "length"}  # the engine's "abort" and "error" are errors here


@dataclass(slots=True)
class Reply:
    """One response under way: its id, the time it was created and what kind of endpoint it answers."""

    kind: str  # "chat" | "completion"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex}"

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, out: RequestOutput) -> dict:
        """The whole response to a request that was not streamed."""
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": None,
                      "finish_reason": FINISH_REASONS[out.finish_reason]}
        else:
            choice = {"index": 0, "text": out.text, "logprobs": None,
                      "finish_reason": FINISH_REASONS[out.finish_reason]}
        return {**self._head(self.object), "choices": [choice], "usage": usage(out)}

    def chunk(self, text: str, finish_reason: str | None = None, first: bool = False,
              with_usage: bool = False) -> dict:
        """One stream chunk: new text, and the finish reason on the last one."""
        reason = FINISH_REASONS[finish_reason] if finish_reason else None
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            body = {**self._head("text_completion"), "choices": [choice]}
        if with_usage:
            body["usage"] = None  # OpenAI's clients expect the key on every chunk once usage is asked for
        return body

    def usage_chunk(self, out: RequestOutput) -> dict:
        """The last chunk when ``stream_options.include_usage`` is set: no choices, the usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(out)}


def usage(out: RequestOutput) -> dict:
    """Token counts, with the prompt tokens served from the prefix cache."""
    m = out.metrics
    return {"prompt_tokens": m.prompt_tokens, "completion_tokens": m.output_tokens,
            "total_tokens": m.prompt_tokens + m.output_tokens,
            "prompt_tokens_details": {"cached_tokens": m.cached_prompt_tokens}}


def model_card(name: str, created: int) -> dict:
    """An entry of ``GET /v1/models``."""
    return {"id": name, "object": "model", "created": created, "owned_by": "kvasir"}
