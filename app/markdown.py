"""Markdown to the HTML subset Qt's rich text understands, with code blocks highlighted by Pygments."""

from __future__ import annotations

import html
import secrets
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

_DARK_STYLE, _LIGHT_STYLE = "monokai", "friendly"
SAFE_SCHEMES = ("http", "https", "mailto")  # the only links model text may carry; the rest show as plain text


def is_safe_link(url: str) -> bool:
    """Whether ``url`` is a link the user may follow out of the app (http, https or mailto)."""
    try:
        return urlsplit(url.strip()).scheme.lower() in SAFE_SCHEMES
    except ValueError:
        return False


def new_action_prefix() -> str:
    """A URL prefix for the app's own links that text written by a model can't guess."""
    return f"kvasir-{secrets.token_hex(16)}:"


def _highlight(code: str, language: str, dark: bool) -> str:
    try:
        lexer = get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=_DARK_STYLE if dark else _LIGHT_STYLE)
    return highlight(code, lexer, formatter)


class MarkdownRenderer:
    """Renders chat text; ``code_blocks`` collects each block's source so the view can offer a copy button."""

    def __init__(self, dark: bool = False, action_prefix: str | None = None) -> None:
        self.dark = dark
        self.action_prefix = action_prefix or new_action_prefix()
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table").enable(
            "strikethrough")
        self._md.add_render_rule("fence", lambda renderer, tokens, idx, options, env: self._fence(tokens[idx]))
        self._md.add_render_rule("code_block", lambda renderer, tokens, idx, options, env: self._fence(tokens[idx]))
        for name, rule in (("link_open", self._link_open), ("link_close", self._link_close), ("image", self._image)):
            self._md.add_render_rule(name, lambda renderer, *args, rule=rule: rule(renderer, *args))
        self.code_blocks: list[str] = []
        self._dropped_links: list[bool] = []  # per open link: was it dropped (so its close tag is dropped too)

    def begin_document(self) -> None:
        """Start a new page: copy links number code blocks from zero again."""
        self.code_blocks = []

    def render(self, text: str) -> str:
        """HTML for ``text``; unfinished markdown (an open code fence while streaming) still renders."""
        border = "#555555" if self.dark else "#cccccc"
        table = f'<table border="1" cellspacing="0" cellpadding="5" style="border-color:{border}; margin: 4px 0;">'
        return self._md.render(text).replace("<table>", table)

    def _link_open(self, renderer, tokens, idx, options, env) -> str:
        # Model text must not reach the app's own actions or other URL handlers: such links keep their text only.
        safe = is_safe_link(tokens[idx].attrGet("href") or "")
        self._dropped_links.append(not safe)
        return renderer.renderToken(tokens, idx, options, env) if safe else ""

    def _link_close(self, renderer, tokens, idx, options, env) -> str:
        dropped = self._dropped_links.pop() if self._dropped_links else False
        return "" if dropped else renderer.renderToken(tokens, idx, options, env)

    def _image(self, renderer, tokens, idx, options, env) -> str:
        # Images would make the view load local files or custom URLs; the alt text says what was meant.
        alt = renderer.renderInlineAsText(tokens[idx].children or [], options, env)
        return f"[image: {html.escape(alt)}]" if alt else "[image]"

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
            f'<span style="float:right;"> <a href="{self.action_prefix}copy/{index}">Copy</a></span></td></tr>'
            f'<tr><td><pre style="margin:0; font-family: monospace;">{body}</pre></td></tr></table>'
        )
