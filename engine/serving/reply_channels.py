"""One reply's reasoning and answer as they stream (see :mod:`engine.templates.reasoning`)."""

from __future__ import annotations

from ..templates.reasoning import ReasoningMarkers, split_reasoning


class ReplyChannels:
    """Splits a reply's released text, output after output, into its reasoning and its answer."""

    def __init__(self, markers: ReasoningMarkers | None, opened: bool) -> None:
        self.markers, self.opened = markers, opened
        self.reasoning = ""
        self.answer = ""
        self.answer_start: int | None = None if markers is not None else 0  # where the answer begins in the text
        self.thinking = False

    def update(self, text: str, final: bool) -> tuple[str, str]:
        """Take the reply's released ``text`` (``final``: all of it, the reply has ended); returns what is new in
        (the answer, the reasoning)."""
        split = split_reasoning(text, self.markers, self.opened, final)
        new_answer, new_reasoning = split.answer[len(self.answer):], split.reasoning[len(self.reasoning):]
        self.answer, self.reasoning = split.answer, split.reasoning
        self.answer_start, self.thinking = split.answer_start, split.thinking
        return new_answer, new_reasoning

    def answer_spans(self, spans) -> tuple[tuple[int, int], ...]:
        """``spans`` of the reply's text ([start, end) pairs) as spans of its answer, the rest dropped."""
        if self.answer_start is None:
            return ()
        offset, length = self.answer_start, len(self.answer)
        return tuple((max(0, start - offset), min(end - offset, length)) for start, end in spans
                     if end > offset and start - offset < length)
