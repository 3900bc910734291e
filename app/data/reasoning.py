"""A reply's reasoning: what a thinking model wrote before its answer, how long it took, and the one line that sums
it up, for the transcript and the Markdown export alike. No Qt in here."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .store import Message

TOKENS, SECONDS = "reasoning_tokens", "reasoning_s"  # a reply's statistics (RequestMetrics' names)


@dataclass(frozen=True, slots=True)
class Reasoning:
    """The reasoning of one reply: its text, the tokens and seconds it took, and whether it is being written."""

    text: str = ""
    tokens: int = 0
    seconds: float | None = None
    thinking: bool = False  # the reply is still in its reasoning: no answer has come yet

    def summary(self) -> str:
        """'Thinking… 42 tokens' while it is written, then 'Thought for 4.2 s, 312 tokens'."""
        tokens = f"{self.tokens:,} token{'' if self.tokens == 1 else 's'}"
        if self.thinking:
            return f"Thinking… {tokens}"
        if self.seconds is None:
            return f"Thought for {tokens}"
        return f"Thought for {self.seconds:.1f} s, {tokens}"


def stored_reasoning(message: Message) -> Reasoning:
    """A finished reply's reasoning, with the figures kept in its statistics (absent or damaged ones left out)."""
    tokens, seconds = message.stats.get(TOKENS), message.stats.get(SECONDS)
    return Reasoning(message.reasoning, tokens if _count(tokens) else 0, seconds if _seconds(seconds) else None)


def ran_out_while_thinking(message: Message) -> bool:
    """A reply cut at the length limit before its reasoning ended: it has reasoning and no answer."""
    return message.stats.get("finish_reason") == "length" and bool(message.reasoning) and not message.text.strip()


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
