"""Text that someone else wrote (a model, a server, an imported chat) shown where Qt would read markup: a
tooltip or a label guesses "rich text" from a leading tag, and an ``<img src="file:...">`` would load a file."""

from __future__ import annotations

import html


def plain_tooltip(text: str) -> str:
    """``text`` as a tooltip that shows it literally, line breaks kept."""
    return "<p style='white-space:pre-wrap'>" + html.escape(text) + "</p>"
