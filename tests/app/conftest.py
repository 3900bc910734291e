import pytest

from tests.helpers.fake_engine import FakeBridge


@pytest.fixture
def window(qtbot, qloop, store, tmp_path, monkeypatch):
    """The main window on a scripted engine and a fresh database."""
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    from app.chats.session import ChatSession
    from app.window.main_window import MainWindow

    w = MainWindow(ChatSession(store, FakeBridge()))
    qtbot.addWidget(w)
    w.show()
    return w


@pytest.fixture(autouse=True)
def no_unexpected_modal_dialogs(request, monkeypatch):
    """A modal dialog nobody answers would hang the run: fail the test instead, with its text. Tests that
    expect one replace these themselves, or answer real ones (``real_dialogs``)."""
    from PySide6.QtWidgets import QMessageBox

    if request.node.get_closest_marker("real_dialogs"):
        return

    def refuse(*args, **kwargs):
        texts = [a for a in args if isinstance(a, str)]
        raise AssertionError(f"a modal dialog opened unexpectedly: {texts}")

    for name in ("warning", "question", "information", "critical"):
        monkeypatch.setattr(QMessageBox, name, staticmethod(refuse))
    monkeypatch.setattr(QMessageBox, "exec", lambda self: refuse(self.text()))


@pytest.fixture
def session(qloop, store, tmp_path, monkeypatch):
    """The app's non-visual layer on a scripted engine and a fresh database, started, with no window."""
    from PySide6.QtWidgets import QApplication

    from app.chats.session import ChatSession

    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    widgets_before = set(QApplication.allWidgets())
    built = ChatSession(store, FakeBridge())
    built.start()
    built.widgets_made = lambda: set(QApplication.allWidgets()) - widgets_before
    yield built
    built.shutdown()
