"""Reasoning ("thinking") in a reply: which markers a model writes its reasoning between, and a reply's text split
into its reasoning and its answer as it streams.

Handled: the ``<think>...</think>`` family (Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3, Phi-4 reasoning,
...) and Magistral's ``[THINK]...[/THINK]``, recognised by the markers in the chat template or the tokenizer's
vocabulary. Only a block that opens the reply counts (or one the prompt opened: templates that start every reply
thinking end their generation prompt with the start marker); markers later in the answer are the answer's text.
gpt-oss's harmony channels are not split: :func:`reasoning_support` says so in its note rather than pretending.
"""

from __future__ import annotations

from dataclasses import dataclass

PROMPT_TAIL_TOKENS = 8  # the prompt's last tokens, decoded to see whether the generation prompt opened a block


@dataclass(frozen=True, slots=True)
class ReasoningMarkers:
    """The text a family writes before and after its reasoning."""

    start: str
    end: str

    def __str__(self) -> str:
        return f"{self.start}…{self.end}"


FAMILIES = (ReasoningMarkers("<think>", "</think>"), ReasoningMarkers("[THINK]", "[/THINK]"))


@dataclass(frozen=True, slots=True)
class ReasoningSupport:
    """What a model's template and tokenizer say about reasoning: its markers (None: its replies are all answer),
    whether the template can be asked not to think (``enable_thinking``), and a note where something is not
    handled."""

    markers: ReasoningMarkers | None = None
    can_turn_off: bool = False
    note: str = ""


def reasoning_support(template_source: str | None, vocabulary) -> ReasoningSupport:
    """The reasoning markers of the model whose chat template is ``template_source`` and whose tokenizer has
    ``vocabulary`` (its token strings)."""
    source = template_source or ""
    for markers in FAMILIES:
        in_template = markers.end in source
        in_vocabulary = markers.start in vocabulary and markers.end in vocabulary
        if in_template or in_vocabulary:
            return ReasoningSupport(markers, "enable_thinking" in source)
    if "<|channel|>" in source:
        return ReasoningSupport(note="gpt-oss's harmony channels are not split: its reasoning is shown as the "
                                     "reply's text")
    return ReasoningSupport()


def opened_by(prompt_tail: str, markers: ReasoningMarkers) -> bool:
    """Whether a prompt ending in ``prompt_tail`` leaves a reasoning block open (the reply starts thinking)."""
    return prompt_tail.rfind(markers.start) > prompt_tail.rfind(markers.end)


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    """A reply's text as reasoning and answer. ``answer_start``: where the answer begins in the reply's text (None
    while it has not begun); ``thinking``: the reasoning has begun and not ended."""

    reasoning: str
    answer: str
    answer_start: int | None
    thinking: bool


def split_reasoning(text: str, markers: ReasoningMarkers | None, opened: bool, final: bool) -> ReasoningSplit:
    """Split a reply's ``text`` so far; ``opened``: the prompt opened the block; ``final``: the reply has ended.

    While the reply goes on, what could still be the start of a marker is held back, and so is whitespace around
    the reasoning, so each part only ever grows as text arrives: a part's new text is what it has beyond the
    last split. A reply that ends inside its reasoning is all reasoning.
    """
    if markers is None:
        return ReasoningSplit("", text, 0, False)
    body_start = 0
    if not opened:
        lead = len(text) - len(text.lstrip())
        head = text[lead:]
        if head.startswith(markers.start):
            body_start = lead + len(markers.start)
        elif not final and markers.start.startswith(head):
            return ReasoningSplit("", "", None, False)  # nothing yet, or what may become the start marker
        else:
            return ReasoningSplit("", text, 0, False)
    end = text.find(markers.end, body_start)
    if end < 0:
        body = text[body_start:]
        if not final:
            body = body[: len(body) - partial_marker(body, markers.end)]
        return ReasoningSplit(body.strip(), "", None, True)
    after = end + len(markers.end)
    rest = text[after:]
    answer_start = after + len(rest) - len(rest.lstrip())
    begun = answer_start < len(text)
    return ReasoningSplit(text[body_start:end].strip(), text[answer_start:] if begun else "",
                          answer_start if begun else None, False)


def partial_marker(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could be the beginning of ``marker``."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0
