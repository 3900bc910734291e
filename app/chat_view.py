"""The conversation on screen: messages rendered from Markdown, with each reply's numbers underneath."""

from __future__ import annotations

import html
from enum import Enum

from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QTextBrowser

from .markdown import MarkdownRenderer, is_safe_link, new_action_prefix
from .store import Message


class MessageAction(Enum):
    """What a message's buttons ask for (besides Copy, which the view does itself)."""

    EDIT = "edit"
    REGENERATE = "regenerate"
    PREVIOUS = "previous"  # the version before
    NEXT = "next"


RENDER_INTERVAL_MS = 50  # at most 20 redraws a second while tokens stream in
STATUS_NOTES = {
    "stopped": "Stopped — the text above is what had arrived.",
    "partial": "Interrupted — the app closed while this reply was being written.",
    "error": "Failed",
}


def stats_line(message: Message) -> str:
    """'TTFT 120 ms · 48 tokens · 21.3 tok/s · 380 of 412 prompt tokens from cache'."""
    s = message.stats
    if not s:
        return ""
    parts = []
    if s.get("ttft_s") is not None:
        parts.append(f"TTFT {s['ttft_s'] * 1000:.0f} ms")
    parts.append(f"{s.get('output_tokens', 0)} tokens")
    if s.get("decode_tokens_per_s"):
        parts.append(f"{s['decode_tokens_per_s']:.1f} tok/s")
    if s.get("prompt_tokens"):
        parts.append(f"{s.get('cached_prompt_tokens', 0):,} of {s['prompt_tokens']:,} prompt tokens from cache")
    return " · ".join(parts)


class ChatView(QTextBrowser):
    """Renders a thread. ``show_thread`` replaces it; ``update_streaming`` redraws the live reply, throttled."""

    copied = Signal(str)
    action = Signal(object, int)  # MessageAction, message id

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._link)
        # The app's own links carry a secret prefix, so a link written by the model can never trigger them.
        self.action_prefix = new_action_prefix()
        self.renderer = MarkdownRenderer(action_prefix=self.action_prefix)
        self._messages: list[Message] = []
        self._streaming: dict[int, str] = {}
        self._versions: dict[int, tuple[int, int]] = {}
        self._skipped = 0
        self._timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self._render)

    def set_dark(self, dark: bool) -> None:
        self.renderer.dark = dark
        self._render()

    def show_thread(self, messages: list[Message], streaming: dict[int, str] | None = None,
                    versions: dict[int, tuple[int, int]] | None = None, skipped: int = 0) -> None:
        """``versions``: message id -> (its number among its versions, how many there are); ``skipped``: how
        many of the first messages are no longer sent to the model."""
        self._skipped = skipped
        self._messages = list(messages)
        self._versions = dict(versions or {})
        self._streaming = dict(streaming or {})
        self._render()

    def update_streaming(self, message_id: int, text: str) -> None:
        self._streaming[message_id] = text
        if not self._timer.isActive():
            self._timer.start()

    def message_text(self, index: int) -> str:
        message = self._messages[index]
        return self._streaming.get(message.id, message.text)

    def _render(self) -> None:
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        self.renderer.begin_document()
        parts = [self._message_html(i, m) for i, m in enumerate(self._messages)]
        if 0 < self._skipped < len(parts):
            parts.insert(self._skipped, '<p align="center" style="color:#b06000;">— the turns above are no longer '
                                        'sent to the model, to make room —</p>')
        if not parts:
            parts.append('<p style="color:#888888; margin-top:40px;" align="center">Say something to start.</p>')
        self.setHtml("".join(parts))
        if at_bottom:
            bar.setValue(bar.maximum())

    def _message_html(self, index: int, message: Message) -> str:
        who = "You" if message.role == "user" else "Kvasir"
        text = self._streaming.get(message.id, message.text)
        body = html.escape(text).replace("\n", "<br>") if message.role == "user" else self.renderer.render(text)
        act = self.action_prefix
        footer = [f'<a href="{act}copymsg/{index}">Copy</a>']
        live = message.id in self._streaming
        if message.role == "user" and not live:
            footer.append(f'<a href="{act}edit/{message.id}">Edit</a>')
        if index == len(self._messages) - 1 and message.role == "assistant" and not live:
            footer.append(f'<a href="{act}regenerate/{message.id}">Regenerate</a>')
        number, count = self._versions.get(message.id, (1, 1))
        if count > 1:
            footer.append(f'<a href="{act}previous/{message.id}">‹</a> {number}/{count} '
                          f'<a href="{act}next/{message.id}">›</a>')
        if message.role == "assistant":
            note = "Writing…" if live and message.status == "partial" else STATUS_NOTES.get(message.status, "")
            if message.status == "error" and message.error:
                note = f"Failed: {html.escape(message.error)}"
            details = stats_line(message)
            footer = [x for x in (details, note, *footer) if x]
        color = "#4a7bd0" if message.role == "user" else "#3a9a6a"
        return (
            f'<div style="margin: 10px 6px 2px 6px;"><b style="color:{color};">{who}</b></div>'
            f'<div style="margin: 0 6px;">{body}</div>'
            f'<div style="margin: 2px 6px 8px 6px; color:#888888; font-size:small;">{" · ".join(footer)}</div>'
        )

    def _link(self, url: QUrl) -> None:
        """A click on a link: one of the view's own actions, or an http(s)/mailto link opened outside."""
        target = url.toString()
        if target.startswith(self.action_prefix):
            self._action(target[len(self.action_prefix):])
        elif is_safe_link(target):
            QDesktopServices.openUrl(url)

    def _action(self, action: str) -> None:
        kind, _, argument = action.partition("/")
        if not argument.isdigit():
            return
        number = int(argument)
        if kind == "copy" and number < len(self.renderer.code_blocks):
            self._copy(self.renderer.code_blocks[number])
        elif kind == "copymsg" and number < len(self._messages):
            self._copy(self.message_text(number))
        elif kind in {a.value for a in MessageAction}:
            self.action.emit(MessageAction(kind), number)

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)
