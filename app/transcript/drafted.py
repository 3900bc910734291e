"""The highlight of a reply's kept draft tokens (speculative decoding): which characters the model took from a draft
rather than wrote one step at a time.

The reply's Markdown is rendered as always; the highlighted words carry two private-use characters around them
(:func:`mark`), which the Markdown renderer turns into a background colour (:func:`markers_to_html`) and which
are taken out of everything that is not prose (code blocks, link targets, tables shown as widgets): only runs of
letters, digits and inner spaces are marked, never a number that starts a line, so no Markdown syntax changes
meaning.
"""

from __future__ import annotations

import re

START, END = "\ue000", "\ue001"
_WORDS = re.compile(r"[^\W_]+(?:[ \t]+[^\W_]+)*")  # letters and digits, with the spaces between them
_MARKERS = re.compile(f"[{START}{END}]")


def mark(text: str, spans) -> str:
    """``text`` with the words inside ``spans`` ([start, end) character ranges, in order) between markers."""
    pieces, at = [], 0
    for start, end in spans:
        start, end = max(start, at), min(end, len(text))
        if start >= end:
            continue
        pieces.append(text[at:start])
        pieces.append(_mark_words(text, start, end))
        at = end
    pieces.append(text[at:])
    return "".join(pieces)


def _mark_words(text: str, start: int, end: int) -> str:
    """``text[start:end]`` with each run of words marked, except a number starting a line (a list's)."""
    part, out, at = text[start:end], [], 0
    for found in _WORDS.finditer(part):
        begin = found.start()
        if found.group()[0].isdigit() and (start + begin == 0 or text[start + begin - 1] == "\n"):
            continue
        out += [part[at:begin], START, found.group(), END]
        at = found.end()
    out.append(part[at:])
    return "".join(out)


def strip(text: str) -> str:
    """``text`` without markers."""
    return _MARKERS.sub("", text) if START in text or END in text else text


def markers_to_html(page: str, color: str) -> str:
    """Rendered HTML with each marked run as a span with ``color`` behind it."""
    if START not in page:
        return page
    return page.replace(START, f'<span style="background-color:{color};">').replace(END, "</span>")
