import pytest

from tests.helpers.fake_engine import FakeBridge


@pytest.fixture
def window(qtbot, qloop, store, tmp_path, monkeypatch):
    """The main window on a scripted engine and a fresh database."""
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    from app.main_window import MainWindow

    w = MainWindow(store, FakeBridge())
    qtbot.addWidget(w)
    w.show()
    return w
