"""Incremental detokenisation with stop strings.

Text is released only when it is final: never half a UTF-8 character (a trailing U+FFFD waits for the
next token), never the beginning of what may turn out to be a stop string, and never the stop string.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 5  # prompt tokens decoded along with the output so word boundaries come out right


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # everything decoded so far (may run past what was released)
        self.released = 0  # characters of ``text`` already handed out
        self.stopped = False

    def add(self, token_id: int) -> None:
        """Decode one more token; sets ``stopped`` when a stop string appears."""
        self._ids.append(token_id)
        prefix = self._decode(self._prefix_offset, self._read_offset)
        full = self._decode(self._prefix_offset, len(self._ids))
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT):
            return
        search_from = max(0, len(self.text) - self._hold)
        self.text += full[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._check_stop(search_from)

    def release(self, final: bool = False) -> str:
        """The text that is now certain. ``final``: the request ended, so nothing is held back."""
        end = len(self.text) if (final or self.stopped) else len(self.text) - self._held_back()
        delta = self.text[self.released : end] if end > self.released else ""
        self.released = max(self.released, end)
        return delta

    def _check_stop(self, search_from: int) -> None:
        found = [i for i in (self.text.find(s, search_from) for s in self._stop) if i >= 0]
        if found:
            self.text = self.text[: min(found)]
            self.stopped = True

    def _held_back(self) -> int:
        """How many trailing characters might be the start of a stop string."""
        for length in range(min(self._hold, len(self.text)), 0, -1):
            tail = self.text[-length:]
            if any(s.startswith(tail) for s in self._stop):
                return length
        return 0

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True)
