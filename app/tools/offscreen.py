"""The real window, offscreen, on the real engine: shared by ``make screenshots`` and the UI benchmark."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class OffscreenApp:
    app: object
    loop: asyncio.AbstractEventLoop
    store: object
    bridge: object
    window: object

    async def load(self, **config) -> None:
        """Start loading the model and wait until it serves."""
        from engine import EngineConfig

        from ..engines.bridge import wait_for

        waiting = asyncio.ensure_future(wait_for(self.bridge.loaded, 600))
        self.bridge.start(EngineConfig(**config))
        await waiting

    def run(self, coroutine):
        """Run ``coroutine`` in the Qt-integrated loop, then shut the engine and the window down."""
        with self.loop:
            try:
                return self.loop.run_until_complete(coroutine)
            finally:
                self.bridge.shutdown()
                self.window.close()
                self.store.close()


def start_offscreen(prefix: str) -> OffscreenApp:
    """A QApplication, a qasync loop, a fresh database in a temporary folder, and the main window."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["KVASIR_DATA_DIR"] = tempfile.mkdtemp(prefix=prefix)
    import qasync

    from ..chats.session import ChatSession
    from ..data.store import Store
    from ..engines.bridge import EngineBridge
    from ..startup.application import create_application
    from ..window.main_window import MainWindow

    app = create_application(sys.argv[:1])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    store = Store(Path(os.environ["KVASIR_DATA_DIR"]) / "kvasir.db")
    bridge = EngineBridge()
    window = MainWindow(ChatSession(store, bridge))
    window.show()
    return OffscreenApp(app, loop, store, bridge, window)
