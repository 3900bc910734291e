"""``python -m app.tools.exit_bench``: how long the app takes to go away when its window is closed mid-reply.

A fresh process opens the real window offscreen on the bundled model, starts ``--chats`` long replies in as many
chats, waits until every one is streaming, then closes the window the way the user does and shuts the engine down
as ``kvasir`` does after its loop. Measured: from the close until both have returned (the replies stopped, the
engine thread ended), and from the close until the process has exited (the model freed with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

CHILD = "--child"
LONG_REPLY = "Write a very long story about a lighthouse keeper, with many chapters."


async def _stream_then_close(offscreen, chats: int) -> dict:
    await offscreen.load(model="default")
    window = offscreen.window
    for _ in range(chats):
        conversation = window.actions.new()
        window.conversations.configure(conversation.id, conversation.preset, conversation.system_prompt,
                                       {**conversation.settings, "max_tokens": 4000})
        window.send(LONG_REPLY)
    while not _all_streaming(stats := offscreen.bridge.stats(), chats):
        await asyncio.sleep(0.05)
    started = time.perf_counter()
    window.close()  # as the user does; the app's loop then stops and ``kvasir`` shuts the bridge down
    offscreen.bridge.shutdown()
    engine = offscreen.bridge.engine
    return {"chats": chats, "streaming_when_closed": stats.num_running, "close_s": time.perf_counter() - started,
            "engine_thread_alive": engine is not None and engine.alive}


def _all_streaming(stats, chats: int) -> bool:
    return stats is not None and stats.num_running >= chats and stats.generated_tokens_total >= 8 * chats


def child(chats: int) -> None:
    from .offscreen import start_offscreen

    offscreen = start_offscreen("kvasir-exit-bench-")
    with offscreen.loop:
        report = offscreen.loop.run_until_complete(_stream_then_close(offscreen, chats))
    print(json.dumps(report), flush=True)  # the parent's clock for the exit starts at this line
    offscreen.store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(CHILD, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.chats)
        return 0
    rows = []
    for _ in range(args.rounds):
        process = subprocess.Popen([sys.executable, "-m", "app.tools.exit_bench", CHILD, "--chats", str(args.chats)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
        line = process.stdout.readline()
        reported = time.perf_counter()
        process.wait(120)
        report = json.loads(line)
        report["exit_after_report_s"] = time.perf_counter() - reported
        report["close_to_exit_s"] = report["close_s"] + report["exit_after_report_s"]
        rows.append({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()})
        print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
