"""What the engine hands back for each request that advanced in a step."""

from __future__ import annotations

from dataclasses import dataclass

from ..templates.tool_calls import ToolCall
from .metrics import RequestMetrics


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """The whole completion so far and what is new in this step: the answer, and apart from it the reasoning."""

    request_id: str
    text: str
    token_ids: list[int]
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None
    error: str | None
    metrics: RequestMetrics
    # [start, end) ranges of ``text`` that came from kept draft tokens (speculative decoding), in order
    kept_draft_spans: tuple[tuple[int, int], ...] = ()
    # the reply's reasoning so far and its new part, for a model that thinks before it answers (``text`` is then
    # the answer alone; see engine.templates.reasoning)
    reasoning: str = ""
    delta_reasoning: str = ""
    # the calls the model asked for so far, each once complete (for a request that parses tool calls; ``text`` is
    # then what it wrote besides them) and those new in this output
    tool_calls: tuple[ToolCall, ...] = ()
    delta_tool_calls: tuple[ToolCall, ...] = ()
