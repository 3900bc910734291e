"""Markdown to the HTML subset Qt's rich text understands, with code blocks highlighted by Pygments."""

from __future__ import annotations

import html

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

_DARK_STYLE, _LIGHT_STYLE = "monokai", "friendly"


def _highlight(code: str, language: str, dark: bool) -> str:
    try:
        lexer = get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=_DARK_STYLE if dark else _LIGHT_STYLE)
    return highlight(code, lexer, formatter)


class MarkdownRenderer:
    """Renders chat text; ``code_blocks`` collects each block's source so the view can offer a copy button."""

    def __init__(self, dark: bool = False) -> None:
        self.dark = dark
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table").enable(
            "strikethrough")
        self._md.add_render_rule("fence", lambda renderer, tokens, idx, options, env: self._fence(tokens[idx]))
        self._md.add_render_rule("code_block", lambda renderer, tokens, idx, options, env: self._fence(tokens[idx]))
        self.code_blocks: list[str] = []

    def begin_document(self) -> None:
        """Start a new page: copy links number code blocks from zero again."""
        self.code_blocks = []

    def render(self, text: str) -> str:
        """HTML for ``text``; unfinished markdown (an open code fence while streaming) still renders."""
        border = "#555555" if self.dark else "#cccccc"
        table = f'<table border="1" cellspacing="0" cellpadding="5" style="border-color:{border}; margin: 4px 0;">'
        return self._md.render(text).replace("<table>", table)

    def _fence(self, token) -> str:
        language = token.info.strip().split(" ")[0] if token.info else ""
        self.code_blocks.append(token.content)
        index = len(self.code_blocks) - 1
        background = "#272822" if self.dark else "#f4f4f4"
        label = html.escape(language or "code")
        body = _highlight(token.content, language, self.dark)
        return (
            f'<table width="100%" cellspacing="0" cellpadding="6" style="background:{background}; margin: 4px 0;">'
            f'<tr><td><span style="color:#888888;">{label}</span>'
            f'<span style="float:right;"> <a href="copy:{index}">Copy</a></span></td></tr>'
            f'<tr><td><pre style="margin:0; font-family: monospace;">{body}</pre></td></tr></table>'
        )
