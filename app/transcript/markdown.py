"""Markdown to the HTML subset Qt's rich text understands, with code blocks highlighted by Pygments.

Rich text is laid out by Qt in time that grows faster than its length, so a message is cut into pieces each
cheap to draw: HTML in chunks of at most :data:`CHUNK_HTML_CHARS`; code blocks (long ones plain, in a scrolled
box); long tables as a table widget; and a message too long to be Markdown at all as the text it is.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from ..theme import CODE_BACKGROUND, DRAFTED, LINK, TABLE_BORDER, for_scheme
from . import drafted

_DARK_STYLE, _LIGHT_STYLE = "monokai", "friendly"
MARKDOWN_LIMIT = 512_000  # characters: a longer message shows as written (parsing it would take seconds)
CHUNK_HTML_CHARS = 8_000  # rich text per label: laying out more at once takes Qt far longer per character
LONG_CODE_CHARS = 20_000  # longer code blocks are shown plain, in a scrolled box (highlighting takes seconds)
TABLE_WIDGET_CELLS = 120  # larger tables are a table widget (rich text laid out 400 rows of 20 in 14 s)
SAFE_SCHEMES = ("http", "https", "mailto")  # the only links model text may carry; the rest show as plain text
# Links carry their colour: Qt fixes a link's colour when the HTML is read, so a theme change must change the HTML.


def is_safe_link(url: str) -> bool:
    """Whether ``url`` is a link the user may follow out of the app (http, https or mailto)."""
    try:
        return urlsplit(url.strip()).scheme.lower() in SAFE_SCHEMES
    except ValueError:
        return False


def _highlight(code: str, language: str, dark: bool) -> str:
    try:
        lexer = get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=_DARK_STYLE if dark else _LIGHT_STYLE)
    return highlight(code, lexer, formatter)


@dataclass(frozen=True, slots=True)
class CodeSegment:
    """A top-level code block: its language (may be empty), its source, and the source highlighted as HTML
    (empty for a block longer than :data:`LONG_CODE_CHARS`, shown plain)."""

    language: str
    code: str
    highlighted: str


@dataclass(frozen=True, slots=True)
class TableSegment:
    """A top-level table of more than :data:`TABLE_WIDGET_CELLS` cells: its cells as plain text, and its
    Markdown."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    source: str


@dataclass(frozen=True, slots=True)
class PlainSegment:
    """A message too long for Markdown (:data:`MARKDOWN_LIMIT`), shown exactly as written."""

    text: str


Segment = str | CodeSegment | TableSegment | PlainSegment


class MarkdownRenderer:
    """Renders chat text: :meth:`segments` splits it into HTML and code blocks (each shown with its own header
    and Copy button); :meth:`render` gives one HTML page."""

    def __init__(self, dark: bool = False) -> None:
        self.dark = dark
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table").enable(
            "strikethrough")
        self._md.add_render_rule("fence", lambda renderer, tokens, idx, options, env: self._fence(tokens[idx]))
        self._md.add_render_rule("code_block", lambda renderer, tokens, idx, options, env: self._fence(tokens[idx]))
        for name, rule in (("link_open", self._link_open), ("link_close", self._link_close), ("image", self._image)):
            self._md.add_render_rule(name, lambda renderer, *args, rule=rule: rule(renderer, *args))
        self._dropped_links: list[bool] = []  # per open link: was it dropped (so its close tag is dropped too)

    def render(self, text: str) -> str:
        """HTML for ``text``; unfinished markdown (an open code fence while streaming) still renders."""
        return self._prose(self._md.render(text))

    def segments(self, text: str) -> list[Segment]:
        """``text`` as HTML chunks and the top-level code blocks and long tables between them, in order. Words
        between :mod:`.drafted`'s markers are highlighted in the HTML, and unmarked everywhere else."""
        if len(text) > MARKDOWN_LIMIT:
            return [PlainSegment(drafted.strip(text))]
        env: dict = {}
        tokens = self._md.parse(text, env)
        lines = text.splitlines(keepends=True)
        pieces: list[Segment] = []
        run: list[str] = []
        for block in _top_level_blocks(tokens):
            first = block[0]
            if first.type in ("fence", "code_block"):
                pieces += self._flush(run)
                pieces.append(self._code(first))
            elif first.type == "table_open" and _cells(block) > TABLE_WIDGET_CELLS:
                pieces += self._flush(run)
                pieces.append(self._table(block, lines))
            else:
                run.append(self._prose(self._md.renderer.render(block, self._md.options, env)))
                if sum(map(len, run)) >= CHUNK_HTML_CHARS:
                    pieces += self._flush(run)
        return pieces + self._flush(run)

    def _flush(self, run: list[str]) -> list[str]:
        """The HTML gathered so far as one chunk (and the run emptied)."""
        chunk = "".join(run)
        run.clear()
        return [chunk] if chunk else []

    def _code(self, token) -> CodeSegment:
        language = drafted.strip(token.info).strip().split(" ")[0] if token.info else ""
        code = drafted.strip(token.content)
        highlighted = _highlight(code, language, self.dark) if len(code) <= LONG_CODE_CHARS else ""
        return CodeSegment(language, code, highlighted)

    def _table(self, block: list, lines: list[str]) -> TableSegment:
        rows, row, header = [], [], ()
        for token in block:
            if token.type == "inline":
                row.append(drafted.strip(self._md.renderer.renderInlineAsText(token.children or [], self._md.options,
                                                                              {})))
            elif token.type == "tr_close":
                rows.append(tuple(row))
                row = []
            elif token.type == "thead_close":
                header, rows = rows[0] if rows else (), []
        start, end = block[0].map or (0, 0)
        return TableSegment(header, tuple(rows), drafted.strip("".join(lines[start:end])))

    def _prose(self, page: str) -> str:
        """Rendered HTML with the theme's table borders and the drafted words' highlight."""
        border = for_scheme(TABLE_BORDER, self.dark)
        table = f'<table border="1" cellspacing="0" cellpadding="5" style="border-color:{border}; margin: 4px 0;">'
        return drafted.markers_to_html(page.replace("<table>", table), for_scheme(DRAFTED, self.dark))

    def _link_open(self, renderer, tokens, idx, options, env) -> str:
        # Model text must not reach other URL handlers (files, custom schemes): such links keep their text only.
        tokens[idx].attrSet("href", drafted.strip(tokens[idx].attrGet("href") or ""))
        safe = is_safe_link(tokens[idx].attrGet("href"))
        self._dropped_links.append(not safe)
        if not safe:
            return ""
        tokens[idx].attrSet("style", f"color: {for_scheme(LINK, self.dark)};")
        return renderer.renderToken(tokens, idx, options, env)

    def _link_close(self, renderer, tokens, idx, options, env) -> str:
        dropped = self._dropped_links.pop() if self._dropped_links else False
        return "" if dropped else renderer.renderToken(tokens, idx, options, env)

    def _image(self, renderer, tokens, idx, options, env) -> str:
        # Images would make the view load local files or custom URLs; the alt text says what was meant.
        alt = drafted.strip(renderer.renderInlineAsText(tokens[idx].children or [], options, env))
        return f"[image: {html.escape(alt)}]" if alt else "[image]"

    def _fence(self, token) -> str:
        """A code block inside a list or quote (top-level ones are :class:`CodeSegment`)."""
        language = drafted.strip(token.info).strip().split(" ")[0] if token.info else ""
        background = for_scheme(CODE_BACKGROUND, self.dark)
        body = _highlight(drafted.strip(token.content), language, self.dark)
        return (
            f'<table width="100%" cellspacing="0" cellpadding="6" style="background:{background}; margin: 4px 0;">'
            f'<tr><td><pre style="margin:0; font-family: monospace;">{body}</pre></td></tr></table>'
        )


def _top_level_blocks(tokens: list) -> list[list]:
    """The parse's tokens grouped by top-level block (a paragraph, a list, a table, a code block...)."""
    blocks, current, depth = [], [], 0
    for token in tokens:
        current.append(token)
        depth += token.nesting
        if depth == 0:
            blocks.append(current)
            current = []
    return blocks + ([current] if current else [])


def _cells(block: list) -> int:
    return sum(token.type in ("th_open", "td_open") for token in block)
