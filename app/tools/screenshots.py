"""``make screenshots``: the app as a user sees it, on the real default model, as PNGs in ``docs/``.

Every reply in them was written by the model (greedy, so the pictures can be made again): nothing is typed
into the database and credited to it. Shots: a chat while three others stream (light and dark), finished
replies with their numbers, the context-full question, the engine panel close up (its numbers, then its
charts), the model manager (its library, and Discover before a search), two models resident at once (an Auto
chat's routed reply beside the panel's list of models, and the routing dialog's rules and evaluation), and a tool
call: the bundled model, held by the chat's tool choice to call a tool of a real MCP server
(:mod:`app.tools.text_tools_server`), and its answer.

One picture is the exception, and its name says so: ``reasoning-example.png`` shows how a thinking model's reply
looks, with a reply written for the picture (stored under the model name "example"), because the bundled model
does not reason.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from .offscreen import start_offscreen

QUESTION = "How do I sort a list of dicts by a key in Python? Show a short code example."
FOLLOW_UP = "And how do I sort from the largest to the smallest?"
ROUTED = "Write a Python function that tells whether a number is prime."
TOOL_QUESTION = "Count the letter r in strawberry."
EXAMPLE_QUESTION = "Is 221 a prime number?"
EXAMPLE_REASONING = ("221 is odd, so 2 is out. Digit sum 5: not divisible by 3. It does not end in 0 or 5. "
                     "221 / 7 = 31.57…, no. 221 / 11 = 20.09…, no. 221 / 13 = 17, exactly. So 221 = 13 × 17.")
EXAMPLE_ANSWER = "No. 221 = 13 × 17, so it is not prime."
STREAMING = ("Write a long story about a lighthouse keeper and her cat.",
             "Write a long, detailed explanation of how bread rises.",
             "Write a long letter to a friend about a trip to Norway.")


def greedy(window, conversation_id: int, max_tokens: int) -> None:
    from ..data.settings import DEFAULTS

    chat = window.conversations.get(conversation_id)
    window.conversations.configure(conversation_id, chat.preset, chat.system_prompt,
                                   {**chat.settings, **DEFAULTS["sampling"], "temperature": 0.0,
                                    "max_tokens": max_tokens})


async def settle() -> None:
    """Let Qt lay out and paint: the loop runs Qt's events while this waits (a nested processEvents() here
    would re-enter the running asyncio task)."""
    await asyncio.sleep(0.2)


async def capture(window, out: Path) -> list[Path]:
    from ..chats.conversation_actions import Overflow

    shots = []

    async def save(widget, name: str) -> None:
        await settle()
        path = out / f"{name}.png"
        widget.grab().save(str(path))
        shots.append(path)

    example = window.current
    greedy(window, example, 160)
    await window.send(QUESTION)
    await window.send(FOLLOW_UP)
    await save(window, "finished-replies")
    tasks = []
    for prompt in STREAMING:  # one after the other, so later chats find the shared system prompt cached
        chat = window.actions.new()
        greedy(window, chat.id, 400)
        tasks.append(window.send(prompt))
        await asyncio.sleep(1.5)
    await asyncio.sleep(2.0)  # the last one streams on screen; a few seconds of history for the plots
    for theme in ("light", "dark"):
        window.apply_theme(theme)
        window.side.show_stats(window.bridge.stats())
        await save(window, f"main-{theme}")
    window.apply_theme("light")
    window.side.show_stats(window.bridge.stats())
    await save(window.panel, "engine-panel")
    window.panel.tabs.setCurrentIndex(1)
    await save(window.panel, "engine-charts")
    window.panel.tabs.setCurrentIndex(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    window.actions.open(example)
    box, _ = window.flow.dialogs.overflow_box(Overflow(needed=2412, limit=2048))
    box.show()
    await save(box, "context-full")
    box.close()
    dialog = window.open_model_manager()
    for _ in range(100):  # the fit estimate arrives from a worker thread
        if dialog.fit.text() != "Estimating…":
            break
        await asyncio.sleep(0.05)
    await save(dialog, "model-manager")
    dialog.tabs.setCurrentWidget(dialog.discover)  # before a search: nothing on it comes from a network
    await save(dialog, "model-manager-discover")
    dialog.close()
    await several_models(window, save)
    await tool_call(window, save)
    await reasoning_example(window, save)
    return shots


async def several_models(window, save) -> None:
    """The bundled model at full precision loaded beside its 4-bit copy; an Auto chat whose code question the
    default routes send to the larger one; the routing dialog, its evaluation run on both."""
    from ..data.settings import local_config

    window.actions.new()
    loading = window.switcher.switch(local_config(window.settings, "default", "none"))
    if loading is not None:
        await loading
    chat = window.actions.new()
    window.model_bar.auto_requested.emit()
    greedy(window, chat.id, 120)
    await window.send(ROUTED)
    window.side.show_stats(window.bridge.stats())
    await save(window, "routed-reply")
    dialog = window.open_routing()
    await save(dialog, "routing-rules")
    dialog.tabs.setCurrentIndex(1)
    await dialog.start_evaluation()
    await save(dialog, "routing-evaluation")
    dialog.close()


async def tool_call(window, save) -> None:
    """A chat with its tools on and ``count_letter`` chosen: the bundled model's call (its arguments its own, the
    form held by constrained decoding), the call opened, and the reply the model wrote from the result."""
    import sys as _sys

    from ..chats.tool_round import RUN
    from ..data.mcp_servers import McpServer
    from ..data.tool_calls import TOOL_CHOICE, TOOLS

    server = McpServer("text-tools", command=_sys.executable, args=("-m", "app.tools.text_tools_server"))
    await window.session.tools.connect([server])
    chat = window.actions.new()
    greedy(window, chat.id, 60)
    window.conversations.set_setting(chat.id, TOOLS, True)
    window.conversations.set_setting(chat.id, TOOL_CHOICE, "count_letter")

    asking_user = window.session.controller.tool_round.approve

    async def run_it(conversation_id, call):  # the question the user sees, pictured, then answered Run
        box, _answers = asking_user.question(call)
        box.show()
        await save(box, "tool-approval")
        box.close()
        return RUN

    window.session.controller.tool_round.approve = run_it
    await window.send(TOOL_QUESTION)
    window.session.controller.tool_round.approve = asking_user
    asking = window.conversations.thread(chat.id)[1]
    line = window.chat.message_widget(asking.id).tool_calls.lines[0]
    line.toggle.click()
    await save(window, "tool-call")
    await window.session.tools.close()


async def reasoning_example(window, save) -> None:
    """How a thinking model's reply shows: its reasoning collapsed above the answer, then opened. The reply is
    written for the picture and stored under the model name "example"."""
    from ..data.store import Status

    chat = window.actions.new()
    user = window.conversations.add_message(chat.id, "user", EXAMPLE_QUESTION)
    reply = window.conversations.add_message(chat.id, "assistant", "", parent_id=user.id, model="example")
    window.conversations.finish_message(reply.id, text=EXAMPLE_ANSWER, reasoning=EXAMPLE_REASONING,
                                        status=Status.COMPLETE,
                                        stats={"reasoning_tokens": 61, "reasoning_s": 1.4, "output_tokens": 77})
    window.actions.open(chat.id)
    window.chat.message_widget(reply.id).reasoning.toggle.click()
    await save(window, "reasoning-example")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    out.mkdir(parents=True, exist_ok=True)
    session = start_offscreen("kvasir-screens-")
    session.window.resize(1360, 860)

    async def run() -> list[Path]:
        await session.load(model="default")
        return await capture(session.window, out)

    shots = session.run(run())
    print("screenshots written: " + ", ".join(str(p) for p in shots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
