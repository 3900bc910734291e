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

    def full(self, finals: list[RequestOutput]) -> dict:
        """The whole response to a request that was not streamed: one choice per reply."""
        choices = []
        for index, out in enumerate(finals):
            reason = finish_reason(out)
            if self.kind == "chat":
                message = {"role": "assistant", "content": out.text or (None if out.tool_calls else "")}
                if out.reasoning:
                    message["reasoning_content"] = out.reasoning  # vLLM's and llama-server's name
                if out.tool_calls:
                    message["tool_calls"] = [call.as_openai() for call in out.tool_calls]
                choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": reason})
            else:
                choices.append({"index": index, "text": out.text, "logprobs": None, "finish_reason": reason})
        return {**self._head(self.object), "choices": choices, "usage": usage(finals)}

    def chunk(self, index: int, text: str, finish_reason: str | None = None, first: bool = False,
              with_usage: bool = False, reasoning: str = "", calls: list[dict] | None = None) -> dict:
        """One stream chunk of reply ``index``: new text (or new reasoning, a chat's ``reasoning_content``, or new
        tool calls), and the finish reason (OpenAI's) on its last one."""
        reason = finish_reason
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            if reasoning:
                delta = {"reasoning_content": reasoning}
            if calls:
                delta = {"tool_calls": calls}
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
            body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
            body = {**self._head("text_completion"), "choices": [choice]}
        if with_usage:
            body["usage"] = None  # OpenAI's clients expect the key on every chunk once usage is asked for
        return body

    def usage_chunk(self, finals: list[RequestOutput]) -> dict:
        """The last chunk when ``stream_options.include_usage`` is set: no choices, the usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(finals)}


def finish_reason(out: RequestOutput) -> str:
    """OpenAI's finish reason of a finished reply: "tool_calls" where it asked for any."""
    return "tool_calls" if out.tool_calls else FINISH_REASONS[out.finish_reason]


def usage(finals: list[RequestOutput]) -> dict:
    """Token counts: the prompt once (as OpenAI counts it for ``n`` replies) with its tokens served from the
    prefix cache, and the tokens of every reply."""
    prompt = finals[0].metrics
    completion = sum(out.metrics.output_tokens for out in finals)
    return {"prompt_tokens": prompt.prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": prompt.cached_prompt_tokens}}


def model_card(name: str, created: int) -> dict:
    """An entry of ``GET /v1/models``."""
    return {"id": name, "object": "model", "created": created, "owned_by": "kvasir"}
