"""Prompt lookup: draft tokens for speculative decoding taken from earlier text, with no second model.

A reply that edits, quotes, summarises or repeats code says again much of what was said before. The proposer
finds the latest earlier occurrence of the sequence's last ``n`` tokens (the longest ``n`` first, from
:data:`MAX_NGRAM` down to :data:`MIN_NGRAM`) in the sequence itself (prompt and reply so far), then in recently
finished sequences, and proposes the tokens that followed it. Each sequence keeps an index of its n-grams,
extended as its tokens arrive, so a lookup is a few dictionary reads whatever the context's length.
"""

from __future__ import annotations

from collections import OrderedDict

MIN_NGRAM, MAX_NGRAM = 2, 4
RECENT_SEQUENCES = 8  # finished sequences whose text later drafts may come from


class NgramIndex:
    """Where each n-gram of a token list last occurred, and the time before: n-gram -> the positions just after
    those occurrences, for every n-gram that has a token after it (so the list's own last n-gram is never its own
    match). The earlier one serves when the latest is so recent that its continuation runs into the list's end
    (a phrase repeated within the last few tokens: indentation, say)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._indexed = 0  # tokens[:_indexed] have their n-grams in the index
        self._next: dict[tuple[int, ...], tuple[int, int | None]] = {}

    def extend(self, tokens: list[int]) -> None:
        """Catch up with ``tokens``: the list indexed before (often the very same object) grown at its end."""
        self.tokens = tokens
        table = self._next
        for n in range(MIN_NGRAM, MAX_NGRAM + 1):
            first = max(self._indexed, n)  # the end of the first n-gram not indexed yet
            # the n-grams ending at first, first + 1, ... before the last token (each has a token after it)
            keys = zip(*(tokens[first - n + i : len(tokens) - n + i] for i in range(n)))
            for end, key in enumerate(keys, start=first):
                seen = table.get(key)
                table[key] = (end, seen[0] if seen else None)
        self._indexed = max(self._indexed, len(tokens))

    def continuation(self, suffix: tuple[int, ...], length: int) -> list[int]:
        """Up to ``length`` tokens that followed ``suffix``'s latest occurrence (the one before where that gives
        more); empty if it never occurred."""
        seen = self._next.get(suffix)
        if seen is None:
            return []
        latest, before = seen
        draft = self.tokens[latest : latest + length]
        if len(draft) < length and before is not None:
            earlier = self.tokens[before : before + length]
            return earlier if len(earlier) > len(draft) else draft
        return draft


class NgramProposer:
    """Drafts for each live sequence from its own text and from recently finished ones."""

    def __init__(self) -> None:
        self._live: dict[str, NgramIndex] = {}
        self._recent: OrderedDict[str, NgramIndex] = OrderedDict()

    def propose(self, request_id: str, tokens: list[int], length: int) -> list[int]:
        """Up to ``length`` tokens to follow ``tokens`` (the request's prompt and reply so far)."""
        if length <= 0:
            return []
        index = self._live.get(request_id)
        if index is None:
            index = self._live[request_id] = NgramIndex()
        index.extend(tokens)
        for n in range(min(MAX_NGRAM, len(tokens)), MIN_NGRAM - 1, -1):
            suffix = tuple(tokens[-n:])
            for source in (index, *reversed(self._recent.values())):
                draft = source.continuation(suffix, length)
                if draft:
                    return draft
        return []

    def finish(self, request_id: str) -> None:
        """The request ended: its text becomes one of the recent ones later drafts may come from."""
        index = self._live.pop(request_id, None)
        if index is None or not index.tokens:
            return
        self._recent[request_id] = index
        while len(self._recent) > RECENT_SEQUENCES:
            self._recent.popitem(last=False)
