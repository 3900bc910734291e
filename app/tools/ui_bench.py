"""``python -m app.tools.ui_bench``: does the window slow the engine, and does the window stay responsive?

Runs the real window offscreen on the default model: the same chats generate with the engine panel shown
and hidden, alternately, and a 10 ms timer measures how late the GUI thread answers while they stream. Then
one reply streams into a chat of 1,000 earlier messages, and into a new chat, with the same timer: a long
chat must stream as smoothly as a new one (only the streaming message is redrawn).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

from .offscreen import start_offscreen

CHATS, TOKENS, ROUNDS = 4, 96, 2
LONG_CHAT = 1000  # earlier messages in the long-chat case


async def generate_round(window, panel_visible: bool) -> float:
    """Decode tokens/s of ``CHATS`` chats generating together."""
    from ..data.settings import DEFAULTS

    window.model_bar.panel_button.setChecked(panel_visible)
    tasks = []
    for i in range(CHATS):
        chat = window.actions.new()
        window.conversations.configure(chat.id, chat.preset, chat.system_prompt, {
            **DEFAULTS["sampling"], "temperature": 0.0, "max_tokens": TOKENS, "seed": i})
        tasks.append(window.send(f"Write a long story about the number {i}."))
    started = time.perf_counter()
    replies = await asyncio.gather(*tasks)
    return sum(r.stats["output_tokens"] for r in replies) / (time.perf_counter() - started)


async def stream_into(window, earlier: int) -> None:
    """One greedy reply of ``TOKENS`` tokens in a chat that already holds ``earlier`` messages."""
    from ..data.settings import DEFAULTS

    chat = window.actions.new()
    window.conversations.configure(chat.id, chat.preset, "", {**DEFAULTS["sampling"], "temperature": 0.0,
                                                             "max_tokens": TOKENS})
    parent = None
    store = window.conversations.store
    with store.transaction():
        for i in range(earlier):
            role = "user" if i % 2 == 0 else "assistant"
            text = f"Question {i}?" if role == "user" else f"Answer {i}: **some** text, then `code`.\n\n- a\n- b"
            parent = store.add_message(chat.id, role, text, parent_id=parent).id
    window.conversations.set_skipped(chat.id, earlier)  # on screen, but not sent: the prompt stays short
    window.actions.open(chat.id)
    await window.send("Write a long story about a lighthouse.")


def lateness_percentiles(samples: list[float]) -> dict:
    late = sorted(samples) or [0.0]
    return {"p50_ms": 1000 * late[len(late) // 2], "p99_ms": 1000 * late[int(len(late) * 0.99)],
            "max_ms": 1000 * late[-1]}


def main() -> int:
    from PySide6.QtCore import QTimer

    session = start_offscreen("kvasir-ui-bench-")
    window = session.window
    lateness: list[float] = []
    ticker = QTimer(interval=10)
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        lateness.append(max(0.0, now - last[0] - 0.010))
        last[0] = now

    ticker.timeout.connect(tick)

    async def run() -> dict:
        await session.load(model="default", num_kv_blocks=1024)
        await generate_round(window, True)  # warm-up
        shown, hidden = [], []
        last[0] = time.perf_counter()
        ticker.start()
        for _ in range(ROUNDS):
            shown.append(await generate_round(window, True))
            hidden.append(await generate_round(window, False))
        ticker.stop()
        late = sorted(lateness)
        streaming = {}
        def first_token(*_) -> None:  # measure while the reply streams, not while the chat opens
            lateness.clear()
            last[0] = time.perf_counter()

        window.controller.first_token.connect(first_token)
        for name, earlier in (("new_chat", 0), ("chat_of_1000_messages", LONG_CHAT)):
            last[0] = time.perf_counter()
            ticker.start()
            await stream_into(window, earlier)
            ticker.stop()
            streaming[name] = {"samples": len(lateness), **lateness_percentiles(lateness)}
        return {
            "gui_lateness_streaming_one_reply": streaming,
            "chats": CHATS, "tokens": TOKENS, "rounds": ROUNDS,
            "panel_shown_tokens_per_s": statistics.median(shown),
            "panel_hidden_tokens_per_s": statistics.median(hidden),
            "ratio_shown_to_hidden": statistics.median(shown) / statistics.median(hidden),
            "gui_lateness_p50_ms": 1000 * late[len(late) // 2],
            "gui_lateness_p99_ms": 1000 * late[int(len(late) * 0.99)],
            "gui_lateness_max_ms": 1000 * late[-1],
        }

    print(json.dumps(session.run(run())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
