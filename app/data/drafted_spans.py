"""A reply's kept drafts in its stats: the character ranges of its text that came from draft tokens the model
kept (speculative decoding), stored with the reply so the transcript can highlight them later."""

from __future__ import annotations

KEPT_DRAFT_SPANS = "kept_draft_spans"  # the stats key: [[start, end], ...], in order, apart


def valid_spans(value) -> list[tuple[int, int]]:
    """Stored ranges that are whole numbers, in order and apart; none at all if any is not."""
    spans: list[tuple[int, int]] = []
    for span in value if isinstance(value, list) else ():
        if not (isinstance(span, list | tuple) and len(span) == 2 and all(type(x) is int for x in span)):
            return []
        start, end = span
        if not 0 <= start < end or (spans and start < spans[-1][1]):
            return []
        spans.append((start, end))
    return spans
