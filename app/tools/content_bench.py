"""``python -m app.tools.content_bench``: does the conversation view keep the window responsive on big content?

Shows, in a real conversation view offscreen, each kind of content that once froze the window: a 20-column
table of 400 rows, a 1 MB code block, 100 kB of prose, a 10 MB message, and a 20-column table of 100 rows
streamed in row by row. A 10 ms timer measures how late the GUI thread answers from the moment the content is
given to the view until everything is on screen. Prints JSON: per case, the lateness (p50, p99, max) and how
long the content took to be shown in full.
"""

from __future__ import annotations

import json
import sys
import time

from .ui_bench import lateness_percentiles

STREAM_STEP_MS = 50  # the view's own redraw interval
PATIENCE_S = 600


def table(rows: int, columns: int = 20) -> str:
    head = "| " + " | ".join(f"col {c}" for c in range(columns)) + " |\n|" + "---|" * columns + "\n"
    body = "".join("| " + " | ".join(f"r{r} c{c} **x**" for c in range(columns)) + " |\n" for r in range(rows))
    return head + body


def cases() -> dict[str, str]:
    prose = "A paragraph with *emphasis*, `code` and [a link](https://example.org). " * 20 + "\n\n"
    return {
        "table_20x400": "Here is the table:\n\n" + table(400),
        "code_block_1MB": "```python\n" + "values = [1, 2, 3]  # a line of code\n" * 28_000 + "```\n",
        "prose_100kB": prose * 70,
        "message_10MB": "word " * 2_000_000,
    }


def settled(view) -> bool:
    """Everything given to the view is on screen: no layout waiting on the render thread or a text box."""
    from ..transcript.blocks import PlainTextBox, TextBlock
    from ..transcript.view import LAYING_OUT

    if view.renders.busy or any(block.text() == LAYING_OUT for block in view.findChildren(TextBlock)):
        return False
    return all(box.loaded for box in view.findChildren(PlainTextBox))


def main() -> int:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from ..data.store import Message
    from ..transcript.view import ChatView

    app = QApplication.instance() or QApplication([])
    lateness: list[float] = []
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        lateness.append(max(0.0, now - last[0] - 0.010))
        last[0] = now

    ticker = QTimer(interval=10)
    ticker.timeout.connect(tick)

    def measure(show, done) -> dict:
        lateness.clear()
        view = ChatView()
        view.resize(1000, 800)
        view.show()
        app.processEvents()
        started = last[0] = time.perf_counter()
        ticker.start()
        show(view)
        while not done(view) and time.perf_counter() - started < PATIENCE_S:
            app.processEvents()
        shown_s = time.perf_counter() - started
        ticker.stop()
        view.close()
        view.deleteLater()
        app.processEvents()
        return {"shown_in_s": round(shown_s, 2), "samples": len(lateness), **lateness_percentiles(lateness)}

    def message(text: str) -> list[Message]:
        return [Message(1, 1, None, "user", "Show me.", 0.0),
                Message(2, 1, 1, "assistant", text, 1.0, model="m")]

    results = {name: measure(lambda view, text=text: view.show_thread(message(text)), settled)
               for name, text in cases().items()}
    results["streaming_table_20x100"] = measure(*_streamer(message, table(100)))
    print(json.dumps(results, indent=1))
    return 0


def _streamer(message, text: str):
    """(show, done): the reply grows one row at a time, every :data:`STREAM_STEP_MS`, as a stream would."""
    from PySide6.QtCore import QTimer

    lines = text.splitlines(keepends=True)
    grown = [0]

    def show(view) -> None:
        view.show_thread(message(""), streaming={2: ""})
        step = QTimer(view, interval=STREAM_STEP_MS)

        def grow() -> None:
            grown[0] += 1
            view.update_streaming(2, "".join(lines[: grown[0]]))
            if grown[0] >= len(lines):
                step.stop()

        step.timeout.connect(grow)
        step.start()

    def done(view) -> bool:
        return grown[0] >= len(lines) and not view._timer.isActive() and settled(view)

    return show, done


if __name__ == "__main__":
    sys.exit(main())
