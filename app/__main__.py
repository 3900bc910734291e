"""The ``kvasir`` command: the desktop app, ``--version``, ``--self-test``, and ``kvasir serve`` (the
OpenAI-compatible endpoint without a window, from the engine's command line; Qt is never imported for it)."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import __version__

IMPORTED = time.monotonic()  # the clock's reading as the app's code starts, where the process's own start is unknown
SELF_TEST_PROMPT = "In one short sentence: what is the capital of France?"
SELF_TEST_TIMEOUT_S = 600


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvasir", description="Kvasir: chat with local language models",
                                     epilog="kvasir serve [--host H] [--port P] [--api-key K] [--model M]: the "
                                            "OpenAI-compatible endpoint without a window (kvasir serve --help)")
    parser.add_argument("--version", action="version", version=f"kvasir {__version__}")
    parser.add_argument("--self-test", action="store_true",
                        help="start offscreen, send one message, print its metrics as JSON, exit")
    parser.add_argument("--model", help="model to start with (default: the one used last, else the bundled one)")
    parser.add_argument("--quant", help="quantisation mode (default: the one used last, else auto)")
    parser.add_argument("--device", help="auto, cpu or cuda (default: the one used last, else auto)")
    parser.add_argument("--data-dir", default=None, help="where chats are stored (default: the user data folder)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        from engine.tools.cli import main as engine_main

        return engine_main(argv, prog="kvasir")
    args = parse_args(argv)
    if args.self_test:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        if not args.data_dir:  # a throwaway chat store, gone when the test ends
            args.data_dir = tempfile.mkdtemp(prefix="kvasir-self-test-")
            atexit.register(shutil.rmtree, args.data_dir, ignore_errors=True)
    if args.data_dir:
        os.environ["KVASIR_DATA_DIR"] = args.data_dir
    from .startup.xcb_check import check_before_qt

    missing = check_before_qt()  # before Qt aborts on a system without the X11 libraries its plugin needs
    if missing is not None:
        return missing
    return run(args)


def run(args: argparse.Namespace) -> int:
    import qasync

    from .chats.session import ChatSession
    from .engines.bridge import EngineBridge
    from .resources import APP_ID, app_icon
    from .startup.application import create_application
    from .window.main_window import MainWindow

    app = create_application(sys.argv[:1])
    app.setApplicationVersion(__version__)
    app.setDesktopFileName(APP_ID)  # the Wayland app id: the desktop entry's icon and name
    app.setWindowIcon(app_icon())
    lock, opened = open_for_this_run(args.self_test)  # the lock is held until run() returns
    if opened is None:
        return 1
    store, library, settings = opened
    try:
        config = starting_config(args, settings)
    except ValueError as exc:
        print(f"kvasir: {exc}", file=sys.stderr)
        lock.unlock()
        return 2
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    bridge = EngineBridge()
    window = MainWindow(ChatSession(store, bridge, library, settings))
    window.show()
    bridge.start(config)
    with loop:
        try:
            if args.self_test:
                return loop.run_until_complete(self_test(window))
            app.aboutToQuit.connect(loop.stop)
            loop.run_forever()
            return 0
        finally:
            bridge.shutdown()  # the engine thread ends before Qt and the loop are torn down
            window.close()
            store.close()
            lock.unlock()


def starting_config(args: argparse.Namespace, settings):
    """The command line's choices, else what served last (the self-test always runs the bundled model)."""
    from engine import EngineConfig

    from .data.settings import engine_load_options

    last = {} if args.self_test else {key: settings[key] for key in ("model", "quantization", "device")}
    model, quantization = args.model or last.get("model", "default"), args.quant or last.get("quantization", "auto")
    return EngineConfig(model=model, quantization=quantization, device=args.device or last.get("device", "auto"),
                        **engine_load_options(settings, model, quantization))


def open_for_this_run(self_test: bool):
    """(the data folder's lock, (store, library, settings)); the second is None when the app must quit:
    another Kvasir uses the folder, or a damaged file was not moved aside."""
    from PySide6.QtWidgets import QMessageBox

    from engine import ModelLibrary, data_dir

    from .data.settings import config_dir
    from .startup.checks import ask_to_move_aside, open_user_files, refuse_in_self_test
    from .startup.single_instance import DataFolderError, acquire_instance_lock, already_running_message

    folder = Path(data_dir())
    try:
        lock = acquire_instance_lock(folder)
    except DataFolderError as exc:
        if self_test:
            print(f"kvasir: {exc}", file=sys.stderr)
        else:
            QMessageBox.warning(None, "Kvasir can't use its data folder", str(exc))
        return None, None
    if lock is None:
        if self_test:
            print(f"kvasir: {already_running_message(folder)}", file=sys.stderr)
        else:
            QMessageBox.information(None, "Kvasir is already running", already_running_message(folder))
        return None, None
    confirm = refuse_in_self_test if self_test else ask_to_move_aside
    opened = open_user_files(folder / "kvasir.db", ModelLibrary(), config_dir() / "settings.json", confirm)
    if opened is None:
        lock.unlock()
    return lock, opened


async def self_test(window) -> int:
    """Wait for the model, send one message, wait for the streamed reply, print its metrics."""
    from .data.store import Status
    from .engines.bridge import wait_for

    started = time.perf_counter()
    bridge = window.bridge
    done = asyncio.ensure_future(wait_for(bridge.loaded, SELF_TEST_TIMEOUT_S))
    failed = asyncio.ensure_future(wait_for(bridge.load_failed, SELF_TEST_TIMEOUT_S))
    await asyncio.sleep(0)  # both are listening now; anything that happened before shows in the bridge's state
    if not bridge.ready and bridge.load_error is None:
        await asyncio.wait({done, failed}, return_when=asyncio.FIRST_COMPLETED)
    for pending in (done, failed):
        pending.cancel()
    if not bridge.ready:
        print(f"self-test failed: the model did not load: {bridge.load_error}", file=sys.stderr)
        return 1
    load_s, ready_s = time.perf_counter() - started, seconds_since_launch()
    conversation = window.conversations.get(window.current)  # greedy, so the check is repeatable
    window.conversations.configure(window.current, conversation.preset, conversation.system_prompt,
                                   {**conversation.settings, "temperature": 0.0, "max_tokens": 48})
    message = await window.send(SELF_TEST_PROMPT)
    stats = message.stats
    if message.status != Status.COMPLETE or not message.text.strip():
        print(f"self-test failed: reply ended as {message.status!r}: {message.error or 'no text'}", file=sys.stderr)
        return 1
    rate = stats.get("decode_tokens_per_s") or 0.0
    print(json.dumps({"ok": True, "ready_s": round(ready_s, 2), "load_s": round(load_s, 2),
                      "ttft_s": stats.get("ttft_s"), "tokens": stats.get("output_tokens"), "tokens_per_s": rate,
                      "cached_tokens": stats.get("cached_prompt_tokens"), "reply": message.text}))
    return 0


def seconds_since_launch() -> float:
    """Seconds since this process started (Linux's /proc), else since the app's code was imported."""
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        started_ticks = int(fields[19])  # field 22, starttime, counted after the command's name
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - IMPORTED


if __name__ == "__main__":
    sys.exit(main())
