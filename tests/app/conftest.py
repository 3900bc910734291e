import asyncio

import pytest

from app.store import Store
from tests.helpers.fake_engine import FakeBridge


@pytest.fixture
def qloop(qapp):
    """An asyncio loop running inside Qt's event loop (qasync), as in the app."""
    import qasync

    loop = qasync.QEventLoop(qapp, already_running=False)
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "kvasir.db")
    yield s
    s.close()


@pytest.fixture
def window(qtbot, qloop, store, tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    from PySide6.QtCore import QSettings

    QSettings.setDefaultFormat(QSettings.IniFormat)
    QSettings.setPath(QSettings.IniFormat, QSettings.UserScope, str(tmp_path / "settings"))
    from app.main_window import MainWindow

    w = MainWindow(store, FakeBridge())
    qtbot.addWidget(w)
    w.show()
    return w
