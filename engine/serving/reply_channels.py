"""One reply's reasoning, answer and tool calls as they stream (see :mod:`engine.templates.reasoning` and
:mod:`engine.templates.tool_calls`)."""

from __future__ import annotations

from ..templates.reasoning import ReasoningMarkers, split_reasoning
from ..templates.tool_calls import ToolCall, ToolCallFormat, ToolCallStream


class ReplyChannels:
    """Splits a reply's released text, output after output, into its reasoning and its answer, and the answer
    into its text and its tool calls where the request offered tools (``tool_format``)."""

    def __init__(self, markers: ReasoningMarkers | None, opened: bool, tool_format: ToolCallFormat | None = None):
        self.markers, self.opened = markers, opened
        self.tools = ToolCallStream(tool_format) if tool_format is not None else None
        self.reasoning = ""
        self.answer = ""  # the answer's text (its tool calls apart)
        self.answer_start: int | None = None if markers is not None else 0  # where the answer begins in the text
        self.thinking = False

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(self.tools.calls) if self.tools else ()

    def update(self, text: str, final: bool) -> tuple[str, str, tuple[ToolCall, ...]]:
        """Take the reply's released ``text`` (``final``: all of it, the reply has ended); returns what is new in
        (the answer's text, the reasoning, the tool calls)."""
        split = split_reasoning(text, self.markers, self.opened, final)
        new_reasoning = split.reasoning[len(self.reasoning):]
        self.reasoning, self.answer_start, self.thinking = split.reasoning, split.answer_start, split.thinking
        if self.tools is None:
            new_answer, self.answer = split.answer[len(self.answer):], split.answer
            return new_answer, new_reasoning, ()
        new_answer, new_calls = self.tools.update(split.answer, final)
        self.answer = self.tools.text
        return new_answer, new_reasoning, tuple(new_calls)

    def answer_spans(self, spans) -> tuple[tuple[int, int], ...]:
        """``spans`` of the reply's text ([start, end) pairs) as spans of its answer, the rest dropped."""
        if self.answer_start is None:
            return ()
        offset, length = self.answer_start, len(self.answer)
        return tuple((max(0, start - offset), min(end - offset, length)) for start, end in spans
                     if end > offset and start - offset < length)
