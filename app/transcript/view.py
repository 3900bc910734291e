"""The conversation on screen: one widget per message, so a streaming reply redraws only itself.

Each message has a speaker header, its text (Markdown for replies: code blocks get a header with the language
and a Copy button), its numbers under a finished reply, and action buttons (Copy, Edit, Regenerate,
Continue, earlier and later versions) that show on hover and stay in the tab order for the keyboard. A long
chat shows its latest messages first and loads earlier ones on request. The view follows a streaming reply
down until the user scrolls up.
"""

from __future__ import annotations

import html
from enum import Enum

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAccessible,
    QAccessibleAnnouncementEvent,
    QGuiApplication,
    QTextDocumentFragment,
)
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QGraphicsOpacityEffect,
    QHBoxLayout,
    QLabel,
    QLayout,
    QPushButton,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..data.reasoning import Reasoning, ran_out_while_thinking, stored_reasoning
from ..data.store import Message, Status
from ..theme import MUTED, QUIET_RULE, SPEAKER, WARNING
from . import drafted
from .blocks import CodeBlock, PlainBlock, TextBlock, block_class
from .markdown import MarkdownRenderer, PlainSegment, Segment
from .reasoning import ReasoningBlock
from .render_worker import SYNC_RENDER_CHARS, RenderWorker
from .tool_calls_view import ToolCallsBlock

RENDER_INTERVAL_MS = 50  # at most 20 redraws a second of the streaming reply
PLAIN_LABEL_CHARS = 20_000  # a longer message of the user's shows in a scrolled box (a label lays it out slowly)
LAYING_OUT = f'<span style="color:{MUTED};">Laying out a long message…</span>'
PAGE = 60  # messages shown at first; "Show earlier messages" adds as many again
READABLE_WIDTH = 860  # pixels: lines longer than this are hard to read
STATUS_NOTES = {
    Status.STOPPED: "Stopped — the text above is what had arrived.",
    Status.PARTIAL: "Interrupted — the app closed while this reply was being written.",
    Status.ERROR: "Failed",
}
LENGTH_NOTE = "Cut at the length limit (Max tokens per reply)."
THINKING_CUT_NOTE = "Ran out of tokens while thinking, before any answer (Max tokens per reply)."
FOOTER_SCALE = 0.9  # the numbers under a reply, relative to the text
# The page's style sheet carries the text size: under a style sheet Qt no longer passes a parent's font down.
PAGE_STYLE = """
QWidget {{ font-size: {text:.2f}pt; }}
QLabel#replyFooter {{ font-size: {small:.2f}pt; }}
QToolButton#reasoningToggle {{ color: {muted}; font-size: {small:.2f}pt; padding-left: 0; }}
#reasoningText {{ color: {muted}; border-width: 0 0 0 2px; border-style: solid; border-color: {rule};
                  padding: 2px 0 4px 10px; margin-left: 4px; }}
QFrame#userMessage {{ background: palette(alternate-base); border-radius: 10px; }}
QToolButton {{ padding: 2px 6px; border: 1px solid transparent; border-radius: 4px; }}
QToolButton:hover {{ border-color: palette(mid); }}
QToolButton:focus {{ border: 2px solid palette(highlight); }}
"""


class MessageAction(Enum):
    """What a message's buttons ask the window for (Copy the view does itself)."""

    EDIT = "edit"
    REGENERATE = "regenerate"
    CONTINUE = "continue"  # a reply cut at max_tokens: write on from where it stopped
    PREVIOUS = "previous"  # the version before
    NEXT = "next"


def stats_line(message: Message) -> str:
    """'TTFT 120 ms · 48 tokens · 21.3 tok/s · 380 of 412 prompt tokens from cache · queued 3 ms'."""
    s = message.stats
    if not s:
        return ""
    parts = []
    if s.get("ttft_s") is not None:
        parts.append(f"TTFT {s['ttft_s'] * 1000:.0f} ms")
    parts.append(f"{s.get('output_tokens', 0)} tokens")
    if s.get("decode_tokens_per_s"):
        parts.append(f"{s['decode_tokens_per_s']:.1f} tok/s")
    if s.get("prompt_tokens") and s.get("cached_prompt_tokens", 0) is None:  # a server that doesn't say
        parts.append(f"{s['prompt_tokens']:,} prompt tokens")
    elif s.get("prompt_tokens"):
        parts.append(f"{s.get('cached_prompt_tokens', 0):,} of {s['prompt_tokens']:,} prompt tokens from cache")
    if s.get("draft_tokens"):
        parts.append(f"{s.get('accepted_draft_tokens', 0):,} of {s['draft_tokens']:,} drafted tokens kept")
    if s.get("queue_time_s") is not None:
        parts.append(f"queued {s['queue_time_s'] * 1000:.0f} ms")
    return " · ".join(parts)


def route_line(message: Message) -> str:
    """How a routed reply's model was chosen: 'Routed to X: the message has code' or 'Run on X: chosen by you'."""
    route = message.stats.get("route")
    if not isinstance(route, dict) or not route.get("model"):
        return ""
    verb = "Routed to" if route.get("by") == "router" else "Run on"
    return f"{verb} {route['model']}: {route.get('reason', '')}".rstrip(": ")


def finished_announcement(message: Message) -> str:
    """What a screen reader says when a reply ends: how it ended, and its length."""
    if message.status == Status.ERROR:
        return f"The reply failed: {message.error or 'no reason given'}"
    ended = {Status.STOPPED: "Reply stopped", Status.PARTIAL: "Reply interrupted"}.get(message.status, "Reply finished")
    if was_cut(message):
        ended = "Reply cut at the length limit; Continue writes on"
    if ran_out_while_thinking(message):
        ended = "Reply ran out of tokens while thinking; Continue writes on"
    tokens = message.stats.get("output_tokens")
    return f"{ended}, {tokens} tokens" if tokens else ended


def was_cut(message: Message) -> bool:
    """A finished reply that stopped at max_tokens rather than where the model ended it."""
    return message.role == "assistant" and message.status == Status.COMPLETE and \
        message.stats.get("finish_reason") == "length"


def _other_models(message: Message) -> list[str]:
    """The models a routed reply can be written again on: those resident when it was routed."""
    route = message.stats.get("route")
    return [m for m in route.get("others", []) if isinstance(m, str)] if isinstance(route, dict) else []


class MessageWidget(QFrame):
    """One message: header, body, numbers and actions. :meth:`show_text` redraws the body alone."""

    def __init__(self, view: ChatView, message: Message) -> None:
        super().__init__()
        self.view, self.message = view, message
        self.setObjectName("userMessage" if message.role == "user" else "reply")
        self.setAccessibleName("Your message" if message.role == "user" else "Reply")
        self.header = QLabel()
        self.reasoning = ReasoningBlock()
        self.tool_calls = ToolCallsBlock()
        self.body = QVBoxLayout()
        self.body.setSpacing(6)
        self.footer = QLabel()
        self.footer.setTextFormat(Qt.PlainText)  # an error's text may come from a server or the model
        self.footer.setWordWrap(True)
        self.footer.setObjectName("replyFooter")
        self.footer.setStyleSheet(f"color: {MUTED};")
        self.actions_row = QWidget()
        self.buttons = QHBoxLayout(self.actions_row)
        self.buttons.setContentsMargins(0, 0, 0, 0)
        self.buttons.setSpacing(2)
        self._opacity = QGraphicsOpacityEffect(self.actions_row)
        self.actions_row.setGraphicsEffect(self._opacity)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 6)
        layout.setSpacing(4)
        layout.addWidget(self.header)
        layout.addWidget(self.reasoning)
        layout.addLayout(self.body)
        layout.addWidget(self.tool_calls)
        layout.addWidget(self.footer)
        layout.addWidget(self.actions_row)
        self._segments: list[QWidget] = []
        self.text = ""
        self.key: tuple | None = None
        self._hovered = False

    # -- content --------------------------------------------------------------------------------------

    def show_message(self, message: Message, text: str, live: bool, version: tuple[int, int] | None,
                     last: bool) -> None:
        """Everything about the message; does nothing when nothing that shows has changed."""
        shown = self.view.shown_text(message, text)
        reasoning = self.view.reasoning_of(message)
        key = (message.text, message.status, message.error, tuple(sorted(message.stats.items())), live, version,
               last, shown if live or shown is not text else None, self.view.renderer.dark, reasoning,
               repr(message.tool_calls))
        if key == self.key:
            return
        self.key, self.message = key, message
        who = "You" if message.role == "user" else f"Kvasir · {message.model}" if message.model else "Kvasir"
        color = SPEAKER["user" if message.role == "user" else "assistant"]
        self.header.setText(f'<b style="color:{color};">{html.escape(who)}</b>')
        self.reasoning.show_reasoning(reasoning)
        self.show_text(shown)
        for block in self._segments:  # a reply that is all reasoning or tool calls leaves no empty line
            block.setHidden(not shown.strip() and bool(message.tool_calls or message.reasoning))
        self.tool_calls.show_calls(message.tool_calls)
        self._show_footer(message, live)
        self._show_buttons(message, live, version, last)

    def set_skipped(self, skipped: bool) -> None:
        """A message the model no longer reads (the user chose to make room) is drawn faded."""
        effect = self.graphicsEffect()
        if skipped and effect is None:
            faded = QGraphicsOpacityEffect(self)
            faded.setOpacity(0.55)
            self.setGraphicsEffect(faded)
        elif not skipped and effect is not None:
            self.setGraphicsEffect(None)

    def show_text(self, text: str) -> bool:
        """The body: plain text for the user's messages, Markdown for replies; widgets reused where they fit.
        A long reply is laid out on the view's render thread and shown when it is ready (the text before stays
        on screen meanwhile). True when its widgets changed (a code block began or ended), so the tab order
        must be redone."""
        self.text = text
        if self.message.role == "user":
            return self.show_segments([text] if len(text) <= PLAIN_LABEL_CHARS else [PlainSegment(text)])
        if len(text) <= SYNC_RENDER_CHARS:
            return self.show_segments(self.view.renderer.segments(text) or [""])
        self.view.renders.ask(self.message.id, text, self.view.renderer.dark)
        return False if self._segments else self.show_segments([LAYING_OUT])

    def show_segments(self, pieces: list[Segment]) -> bool:
        """Each piece in its block, reusing the block already there when it is of the right kind."""
        before = len(self._segments), [type(w) for w in self._segments]
        for index, piece in enumerate(pieces):
            widget = self._segments[index] if index < len(self._segments) else None
            wanted = block_class(piece)
            if type(widget) is not wanted:
                if widget is not None:
                    self._drop_segments(index)
                widget = self._new_block(piece)
                self._segments.append(widget)
                self.body.addWidget(widget)
            elif isinstance(widget, CodeBlock):
                widget.show_segment(piece, self.view.renderer.dark)
            else:
                widget.show_segment(piece)
        self._drop_segments(len(pieces))
        return before != (len(self._segments), [type(w) for w in self._segments])

    def _new_block(self, piece: Segment) -> QWidget:
        wanted = block_class(piece)
        if wanted is TextBlock:
            block = TextBlock(rich=self.message.role != "user")
            block.show_segment(piece)
            return block
        if wanted is CodeBlock:
            return CodeBlock(piece, self.view.copy, self.view.renderer.dark)
        if wanted is PlainBlock:
            return PlainBlock(piece, note=self.message.role != "user")
        return wanted(piece, self.view.copy)

    def _drop_segments(self, keep: int) -> None:
        for widget in self._segments[keep:]:
            self.body.removeWidget(widget)
            widget.deleteLater()
        del self._segments[keep:]

    def _show_footer(self, message: Message, live: bool) -> None:
        parts = []
        if message.role == "assistant":
            note = "Writing…" if live else STATUS_NOTES.get(message.status, "")
            if message.status == Status.ERROR and message.error and not live:
                note = f"Failed: {message.error}"
            if was_cut(message) and not live:
                note = THINKING_CUT_NOTE if ran_out_while_thinking(message) else LENGTH_NOTE
            parts = [p for p in (route_line(message), stats_line(message) if not live else "", note) if p]
        self.footer.setText(" · ".join(parts))
        self.footer.setVisible(bool(parts))
        self.setAccessibleDescription(self.footer.text())

    def _show_buttons(self, message: Message, live: bool, version: tuple[int, int] | None, last: bool) -> None:
        while self.buttons.count():
            item = self.buttons.takeAt(0)
            if item.widget():
                item.widget().deleteLater()
        self.add_button("Copy", "Copy this message", lambda: self.view.copy(self.text))
        mine = message.role == "user"
        if mine and not live:
            self.add_button("Edit", "Edit this message and send it again",
                            lambda: self.view.ask(MessageAction.EDIT, message.id))
        if last and not mine and not live:
            if was_cut(message):
                self.add_button("Continue", "Write on from where the reply stopped",
                                lambda: self.view.ask(MessageAction.CONTINUE, message.id))
            self.add_button("Regenerate", "Write this reply again (Ctrl+R)",
                            lambda: self.view.ask(MessageAction.REGENERATE, message.id))
            for other in _other_models(message):
                self.add_button(f"Run on {other}", f"Write this reply again on {other}, and keep the chat there",
                                lambda _=False, model=other: self.view.run_on.emit(message.id, model))
        if version is not None and version[1] > 1:
            number, count = version
            self.add_button("‹", "Earlier version", lambda: self.view.ask(MessageAction.PREVIOUS, message.id))
            position = QLabel(f"{number}/{count}")
            position.setAccessibleName(f"Version {number} of {count}")
            self.buttons.addWidget(position)
            self.add_button("›", "Later version", lambda: self.view.ask(MessageAction.NEXT, message.id))
        self.buttons.addStretch(1)
        self._update_opacity()

    def add_button(self, text: str, tip: str, clicked) -> QToolButton:
        button = QToolButton(text=text)
        button.setAutoRaise(True)
        button.setToolTip(tip)
        button.setAccessibleName(tip)
        button.setFocusPolicy(Qt.StrongFocus)
        button.clicked.connect(clicked)
        button.installEventFilter(self)
        self.buttons.addWidget(button)
        return button

    def focusables(self) -> list[QWidget]:
        """What Tab stops at in this message, top to bottom: its text and code blocks, then its buttons."""
        found: list[QWidget] = self.reasoning.focusables()
        for widget in self._segments:
            found += widget.focusables()
        found += self.tool_calls.focusables()
        items = (self.buttons.itemAt(i).widget() for i in range(self.buttons.count()))
        return found + [w for w in items if isinstance(w, QToolButton)]

    def button(self, text: str) -> QToolButton | None:
        items = (self.buttons.itemAt(i).widget() for i in range(self.buttons.count()))
        return next((w for w in items if isinstance(w, QToolButton) and w.text() == text), None)

    def plain_text(self) -> str:
        pieces = [QTextDocumentFragment.fromHtml(self.header.text()).toPlainText(), self.reasoning.plain_text()]
        pieces += [widget.plain_text() for widget in self._segments]
        pieces += [self.tool_calls.plain_text(), self.footer.text()]
        items = (self.buttons.itemAt(i).widget() for i in range(self.buttons.count()))
        pieces.append(" ".join(w.text() for w in items if w is not None))
        return "\n".join(p for p in pieces if p)

    # -- actions on hover, and for the keyboard --------------------------------------------------------

    def enterEvent(self, event) -> None:
        self._hovered = True
        self._update_opacity()
        super().enterEvent(event)

    def leaveEvent(self, event) -> None:
        self._hovered = False
        self._update_opacity()
        super().leaveEvent(event)

    def eventFilter(self, watched, event) -> bool:
        if event.type() in (QEvent.FocusIn, QEvent.FocusOut):
            QTimer.singleShot(0, self._update_opacity)
        return False

    def _update_opacity(self) -> None:
        focused = any(b.hasFocus() for b in self.actions_row.findChildren(QToolButton))
        last = self.view.last_widget() is self
        self._opacity.setOpacity(1.0 if self._hovered or focused or last else 0.0)


class _Page(QWidget):
    """The scrolled column. Its height is its height for the real width: word-wrapped labels otherwise ask for
    the height they would need at a narrow width, which left blank space under the last message."""

    def minimumSizeHint(self) -> QSize:
        return QSize(0, 0)

    def sizeHint(self) -> QSize:
        width = self.width() or 600
        return QSize(width, self.heightForWidth(width))


class ChatView(QScrollArea):
    """The thread. Bound to a :class:`~app.transcript.model.Transcript` (:meth:`set_model`), it follows the model:
    a reset shows the whole thread (``show_thread``, reusing the widgets of unchanged messages), new rows at the
    end are added alone, a changed row is redrawn alone, and a streaming reply's text is redrawn throttled
    (``update_streaming``). It keeps the widgets, the paging, following the stream and the focus order."""

    copied = Signal(str)
    action = Signal(object, int)  # MessageAction, message id
    run_on = Signal(int, str)  # a routed reply's message id, and the resident model to write it again on

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setAccessibleName("Conversation")
        self.renderer = MarkdownRenderer()
        self.renders = RenderWorker(self)
        self.renders.rendered.connect(self._rendered)
        self.page = _Page()
        self.page.setObjectName("transcript")
        self.column = QVBoxLayout(self.page)
        # no minimum height from the labels' narrow-width guesses: the scroll area sizes the page by its
        # height for the real width, so nothing blank is left under the last message
        self.column.setSizeConstraint(QLayout.SetNoConstraint)
        self.column.setContentsMargins(8, 8, 8, 8)
        self.column.setSpacing(6)
        self.earlier = QPushButton("Show earlier messages")
        self.earlier.clicked.connect(self._show_earlier)
        self._base_point_size = self.font().pointSizeF() if self.font().pointSizeF() > 0 else 10.0
        self._chain: list[int] = []  # the widgets after the view in the tab order, as last chained
        self.last_announcement = ""
        self.column.addWidget(self.earlier, 0, Qt.AlignHCenter)
        self.notice = QLabel("")
        self.notice.setAlignment(Qt.AlignCenter)
        self.notice.setWordWrap(True)
        self.column.addWidget(self.notice)
        self.column.addStretch(1)
        self.setWidget(self.page)
        self._messages: list[Message] = []
        self._streaming: dict[int, str] = {}
        self._versions: dict[int, tuple[int, int]] = {}
        self._skipped = 0
        self._shown = PAGE
        self._widgets: dict[int, MessageWidget] = {}
        self._order: list[int] = []
        self._follow = True
        self._dirty: set[int] = set()
        self.model = None
        self.highlight_drafts = False  # View > Highlight drafted words
        self.full_renders = 0  # passes over every message on screen (a new chat, a replaced thread)
        self._timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self._render_streaming)
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)
        QApplication.instance().focusChanged.connect(self._focus_changed)
        self.set_text_scale(100)

    # -- what the window calls ------------------------------------------------------------------------

    def set_dark(self, dark: bool) -> None:
        self.renderer.dark = dark
        # A style sheet takes the palette when it is applied: set it again, or the page keeps the old theme's
        # background and the buttons' new text colour lands on it (light on light).
        style = self.page.styleSheet()
        self.page.setStyleSheet("")
        self.page.setStyleSheet(style)
        self._render()

    def set_highlight_drafts(self, on: bool) -> None:
        """Highlight, or not, the words of replies that came from kept draft tokens (speculative decoding)."""
        if on != self.highlight_drafts:
            self.highlight_drafts = on
            self._render()

    def shown_text(self, message: Message, text: str) -> str:
        """``text`` (``message``'s, or what has arrived of it) as the view shows it: with the words that came from
        kept drafts marked for the highlight where it is on."""
        if not self.highlight_drafts or message.role != "assistant" or self.model is None:
            return text
        spans = self.model.kept_drafts(message)
        return drafted.mark(text, spans) if spans else text

    def reasoning_of(self, message: Message) -> Reasoning:
        """A reply's reasoning: so far while it is written, else as stored."""
        return self.model.reasoning(message) if self.model is not None else stored_reasoning(message)

    def set_text_scale(self, percent: int) -> None:
        """Messages and code blocks at ``percent`` of the normal text size (the numbers under replies and the line
        over their reasoning a little smaller)."""
        size = self._base_point_size * percent / 100
        style = PAGE_STYLE.format(text=size, small=size * FOOTER_SCALE, muted=MUTED, rule=QUIET_RULE)
        if self.page.styleSheet() != style:
            self.page.setStyleSheet(style)

    def show_thread(self, messages: list[Message], streaming: dict[int, str] | None = None,
                    versions: dict[int, tuple[int, int]] | None = None, skipped: int = 0) -> None:
        """``versions``: message id -> (its number among its versions, how many there are); ``skipped``: how
        many of the first messages are no longer sent to the model."""
        if not messages or not self._messages or messages[0].conversation_id != self._messages[0].conversation_id:
            self._shown, self._follow = PAGE, True  # another chat: its latest messages, followed
        self._messages, self._skipped = list(messages), skipped
        self._versions = dict(versions or {})
        self._streaming = dict(streaming or {})
        self._render()

    def set_model(self, model) -> None:
        """Show ``model``'s thread and follow its changes from now on."""
        self.model = model
        model.modelReset.connect(self._model_reset)
        model.rowsInserted.connect(self._rows_inserted)
        model.dataChanged.connect(self._rows_changed)
        self._model_reset()

    def _model_reset(self) -> None:
        model = self.model
        self.show_thread(model.messages, model.live, model.versions, model.skipped)

    def _rows_inserted(self, _parent, first: int, last: int) -> None:
        """Messages added at the end: their widgets alone, unless the page would grow past what it shows."""
        model = self.model
        if first != len(self._messages) or len(model.messages) > self._shown or model.skipped != self._skipped:
            self._model_reset()
            return
        self._messages, self._versions = list(model.messages), dict(model.versions)
        self._streaming = dict(model.live)
        previous_last = len(self._order) - 1
        for row in range(first, last + 1):
            message = self._messages[row]
            widget = self._widgets[message.id] = MessageWidget(self, message)
            self.column.insertWidget(2 + len(self._order), widget)
            self._order.append(message.id)
        for row in ([previous_last] if previous_last >= 0 else []) + list(range(first, last + 1)):
            self._show_row(row)  # the previous last message loses its last-message buttons
        for message_id in self._order[-2:]:
            self._widgets[message_id]._update_opacity()
        self._show_notice()
        self._chain_focus()

    def _rows_changed(self, top, bottom, _roles=()) -> None:
        """A row's message or its live state changed: that message redrawn; its text alone while it streams."""
        model, redrawn = self.model, False
        for row in range(top.row(), bottom.row() + 1):
            message = model.messages[row]
            if row >= len(self._messages) or self._messages[row].id != message.id:
                self._model_reset()
                return
            live = message.id in model.live
            if live and message.id in self._streaming and self._messages[row] is message:
                self.update_streaming(message.id, model.live[message.id])  # the text alone, throttled
                continue
            self._messages[row], self._versions = message, dict(model.versions)
            if live:
                self._streaming[message.id] = model.live[message.id]
            else:
                self._streaming.pop(message.id, None)
            self._show_row(row)
            redrawn = True
        if redrawn:
            self._chain_focus()

    def _show_row(self, row: int) -> None:
        """One message's widget redrawn from the view's state (nothing when the message is not on the page)."""
        message = self._messages[row]
        widget = self._widgets.get(message.id)
        if widget is None:
            return
        live = message.id in self._streaming
        widget.show_message(message, self._streaming.get(message.id, message.text), live,
                            self._versions.get(message.id), message.id == self._order[-1])
        widget.set_skipped(row < self._skipped)

    def update_streaming(self, message_id: int, text: str) -> None:
        self._streaming[message_id] = text
        self._dirty.add(message_id)
        if not self._timer.isActive():
            self._timer.start()

    def message_widget(self, message_id: int) -> MessageWidget | None:
        return self._widgets.get(message_id)

    def last_widget(self) -> MessageWidget | None:
        return self._widgets.get(self._order[-1]) if self._order else None

    def toPlainText(self) -> str:
        """Everything on screen as text (the notice, each message with its numbers and buttons)."""
        texts = [self.notice.text()] if self.notice.isVisible() else []
        return "\n".join(texts + [self._widgets[i].plain_text() for i in self._order])

    def copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)

    def ask(self, action: MessageAction, message_id: int) -> None:
        self.action.emit(action, message_id)

    def announce(self, text: str) -> None:
        """Have a screen reader say ``text`` (a reply ended) without moving the focus."""
        self.last_announcement = text
        QAccessible.updateAccessibility(QAccessibleAnnouncementEvent(self, text))

    # -- drawing -----------------------------------------------------------------------------------------

    def _render(self) -> None:
        self.full_renders += 1
        visible = self._messages[-self._shown:] if self._shown < len(self._messages) else self._messages
        self.earlier.setVisible(len(visible) < len(self._messages))
        wanted = [m.id for m in visible]
        for gone in set(self._widgets) - set(wanted):
            widget = self._widgets.pop(gone)
            self.column.removeWidget(widget)
            widget.deleteLater()
        first_index = len(self._messages) - len(visible)
        for offset, message in enumerate(visible):
            widget = self._widgets.get(message.id)
            if widget is None:
                widget = self._widgets[message.id] = MessageWidget(self, message)
            position = self.column.indexOf(widget)
            if position != offset + 2:  # after the "earlier" button and the notice
                if position >= 0:
                    self.column.removeWidget(widget)
                self.column.insertWidget(offset + 2, widget)
            live = message.id in self._streaming
            widget.show_message(message, self._streaming.get(message.id, message.text), live,
                                self._versions.get(message.id), offset == len(visible) - 1)
            widget.set_skipped(first_index + offset < self._skipped)
        self._order = wanted
        for message_id in wanted[-2:]:  # the last message keeps its actions in view
            self._widgets[message_id]._update_opacity()
        self._show_notice()
        self._chain_focus()

    def focusables(self) -> list[QWidget]:
        """Where Tab stops after the view itself, top to bottom."""
        found: list[QWidget] = [self.earlier] if not self.earlier.isHidden() else []
        for message_id in self._order:
            found += self._widgets[message_id].focusables()
        return found

    def _chain_focus(self) -> None:
        """Put the messages' text and buttons right after the view in the tab order, in reading order (Qt
        appends widgets made later at the end of the window's chain, after the composer and the panel)."""
        chain = self.focusables()
        ids = [id(w) for w in chain]
        if ids == self._chain:
            return
        self._chain = ids
        previous: QWidget = self
        for widget in chain:
            QWidget.setTabOrder(previous, widget)
            previous = widget

    def _focus_changed(self, _old, new) -> None:
        if new is not None and new is not self and self.page.isAncestorOf(new):
            self.ensureWidgetVisible(new, 0, 24)

    def _show_notice(self) -> None:
        if not self._messages:
            self.notice.setText(f'<span style="color:{MUTED};">Say something to start.</span>')
        elif 0 < self._skipped < len(self._messages):
            self.notice.setText(f'<span style="color:{WARNING};">The first {self._skipped} messages are no longer '
                                "sent to the model, to make room.</span>")
        else:
            self.notice.setText("")
        self.notice.setVisible(bool(self.notice.text()))

    def _render_streaming(self) -> None:
        changed = False
        for message_id in self._dirty:
            widget = self._widgets.get(message_id)
            if widget is not None and message_id in self._streaming:
                changed = widget.reasoning.show_reasoning(self.reasoning_of(widget.message)) or changed
                changed = widget.show_text(self.shown_text(widget.message, self._streaming[message_id])) or changed
        self._dirty.clear()
        if changed:
            self._chain_focus()  # a new code block's Copy button joins the tab order where it shows

    def _rendered(self, message_id: int, text: str, dark: bool, segments: list[Segment]) -> None:
        """A long message laid out on the render thread: shown if it is still what the widget should show."""
        widget = self._widgets.get(message_id)
        if widget is not None and widget.text == text and dark == self.renderer.dark:
            if widget.show_segments(segments or [""]):
                self._chain_focus()

    def _show_earlier(self) -> None:
        bar = self.verticalScrollBar()
        from_bottom = bar.maximum() - bar.value()
        self._shown += PAGE
        self._follow = False
        self._render()
        QTimer.singleShot(0, lambda: bar.setValue(bar.maximum() - from_bottom))  # keep the reading place

    # -- following the stream -----------------------------------------------------------------------------

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 8  # scrolled up: stop following; back at the bottom: follow

    def _range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    def resizeEvent(self, event) -> None:
        """Lines no longer than :data:`READABLE_WIDTH`: wider windows get margins, not longer lines."""
        side = max(8, (self.viewport().width() - READABLE_WIDTH) // 2)
        self.column.setContentsMargins(side, 8, side, 8)
        super().resizeEvent(event)

    def event(self, event) -> bool:
        if event.type() == QEvent.Show:
            self._follow = True
        return super().event(event)
