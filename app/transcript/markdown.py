"""Markdown to the HTML subset Qt's rich text understands, with code blocks highlighted by Pygments."""

from __future__ import annotations

import html
from dataclasses import dataclass
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from ..theme import CODE_BACKGROUND, LINK, TABLE_BORDER, for_scheme

_DARK_STYLE, _LIGHT_STYLE = "monokai", "friendly"
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
    """A top-level code block: its language (may be empty), its source, and the source highlighted as HTML."""

    language: str
    code: str
    highlighted: str


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
        return self._tables(self._md.render(text))

    def segments(self, text: str) -> list[str | CodeSegment]:
        """``text`` as HTML pieces and the top-level code blocks between them, in order."""
        env: dict = {}
        tokens = self._md.parse(text, env)
        pieces: list[str | CodeSegment] = []
        run: list = []
        for token in tokens:
            if token.type in ("fence", "code_block") and token.level == 0:
                if run:
                    pieces.append(self._tables(self._md.renderer.render(run, self._md.options, env)))
                    run = []
                language = token.info.strip().split(" ")[0] if token.info else ""
                pieces.append(CodeSegment(language, token.content, _highlight(token.content, language, self.dark)))
            else:
                run.append(token)
        if run:
            pieces.append(self._tables(self._md.renderer.render(run, self._md.options, env)))
        return pieces

    def _tables(self, page: str) -> str:
        border = for_scheme(TABLE_BORDER, self.dark)
        table = f'<table border="1" cellspacing="0" cellpadding="5" style="border-color:{border}; margin: 4px 0;">'
        return page.replace("<table>", table)

    def _link_open(self, renderer, tokens, idx, options, env) -> str:
        # Model text must not reach other URL handlers (files, custom schemes): such links keep their text only.
        safe = is_safe_link(tokens[idx].attrGet("href") or "")
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
        alt = renderer.renderInlineAsText(tokens[idx].children or [], options, env)
        return f"[image: {html.escape(alt)}]" if alt else "[image]"

    def _fence(self, token) -> str:
        """A code block inside a list or quote (top-level ones are :class:`CodeSegment`)."""
        language = token.info.strip().split(" ")[0] if token.info else ""
        background = for_scheme(CODE_BACKGROUND, self.dark)
        body = _highlight(token.content, language, self.dark)
        return (
            f'<table width="100%" cellspacing="0" cellpadding="6" style="background:{background}; margin: 4px 0;">'
            f'<tr><td><pre style="margin:0; font-family: monospace;">{body}</pre></td></tr></table>'
        )
