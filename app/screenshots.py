"""``make screenshots``: the main window (light and dark, during generation) and the model manager, as PNGs.

The example conversation with code and a table is typed in here; the two chats generating beside it run on
the real default model, so the panel's numbers are live.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from .offscreen import start_offscreen

EXAMPLE_QUESTION = "How do I sort a list of dicts by a key in Python? A small table of options, please."
EXAMPLE_REPLY = """Use `sorted` with a `key` function:

```python
from operator import itemgetter

people = [{"name": "Ada", "age": 36}, {"name": "Alan", "age": 41}]
by_age = sorted(people, key=itemgetter("age"))
```

| option | effect |
|---|---|
| `reverse=True` | largest first |
| `key=itemgetter("age")` | a little faster than a lambda |
| `list.sort(...)` | sorts in place |

`sorted` is **stable**, so equal ages keep their order."""


async def capture(window, out: Path) -> None:
    from PySide6.QtWidgets import QApplication

    from .chat_controller import DEFAULT_SAMPLING

    store = window.store
    example = window.current
    store.update_conversation(example, title="Sorting in Python")
    question = store.add_message(example, "user", EXAMPLE_QUESTION)
    store.add_message(example, "assistant", EXAMPLE_REPLY, parent_id=question.id, model="SmolLM2-135M-Instruct")
    tasks = []
    prompts = ("Write a long story about a lighthouse keeper and her cat.",
               "Write a long, detailed explanation of how bread rises.",
               "Write a long letter to a friend about a trip to Norway.")
    for prompt in prompts:  # one after the other, so later chats find the shared system prompt cached
        window.new_conversation()
        store.update_conversation(window.current, settings={**DEFAULT_SAMPLING, "max_tokens": 400, "seed": 7})
        tasks.append(window.send(prompt))
        await asyncio.sleep(1.5)
    window.open_conversation(example)
    for _ in range(40):  # a few seconds of history for the plots, while the chats are still generating
        if window.bridge.stats().num_running < 2:
            break
        await asyncio.sleep(0.1)
    for theme in ("light", "dark"):
        window.apply_theme(theme)
        window._stats(window.bridge.stats())
        QApplication.processEvents()
        window.grab().save(str(out / f"main-{theme}.png"))
    window.apply_theme("light")
    dialog = window.open_model_manager()
    QApplication.processEvents()
    dialog.grab().save(str(out / "model-manager.png"))
    dialog.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    out.mkdir(parents=True, exist_ok=True)
    session = start_offscreen("kvasir-screens-")
    session.window.resize(1360, 860)

    async def run() -> None:
        await session.load(model="default", num_kv_blocks=512)
        await capture(session.window, out)

    session.run(run())
    print(f"screenshots written to {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
