"""The model manager dialog over the library, and the model picker in the top bar."""

from app.dialogs.model_manager import LibraryTableModel, ModelDialog
from engine.models.library import ModelLibrary


def test_library_table_model_passes_the_model_tester(qtmodeltester, tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    library = ModelLibrary()
    library.add(str(tiny_llama))
    model = LibraryTableModel(library)
    qtmodeltester.check(model)
    assert model.rowCount() == 2 and model.index(0, 0).data() == "SmolLM2-135M-Instruct"
    assert model.index(0, 6).data() == "bundled" and model.index(1, 1).data() == "llama"


def test_add_shows_fit_and_remove(qtbot, tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    dialog = ModelDialog(ModelLibrary(), "nf4")
    qtbot.addWidget(dialog)
    with qtbot.wait_signal(dialog.fit_shown):
        pass  # estimated on a worker thread, answered through the event loop
    assert "Fits." in dialog.fit.text() and "(nf4, float32)" in dialog.fit.text()
    assert not dialog.remove.isEnabled()  # the bundled model stays
    entry = dialog.add(str(tiny_llama))
    assert dialog.selected().spec == entry.spec and dialog.remove.isEnabled()
    with qtbot.wait_signal(dialog.fit_shown):
        dialog.quant.setCurrentText("none")
    assert "(none, float32)" in dialog.fit.text()
    dialog.remove_selected()
    assert dialog.model.rowCount() == 1


def test_bad_model_is_refused_in_words(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    warnings = []
    monkeypatch.setattr("app.dialogs.model_manager.QMessageBox.warning",
                        lambda parent, title, text: warnings.append(text))
    dialog = ModelDialog(ModelLibrary())
    qtbot.addWidget(dialog)
    (tmp_path / "model.pt").write_bytes(b"pickle")
    assert dialog.add(str(tmp_path / "model.pt")) is None
    assert "pickle checkpoint" in warnings[0] and dialog.model.rowCount() == 1


def test_loading_from_the_manager_switches_the_bridge(qtbot, window, qloop, tmp_path, tiny_llama, monkeypatch):
    switched = []

    async def switch(config):
        switched.append(config)

    monkeypatch.setattr(window.bridge, "switch", switch)
    window.library.add(str(tiny_llama))
    dialog = window.open_model_manager()
    dialog.table.selectRow(1)
    dialog.quant.setCurrentText("int8")
    with qtbot.wait_signal(dialog.finished):
        dialog.load.click()
    qloop.run_until_complete(__import__("asyncio").sleep(0.01))
    assert switched[-1].model == str(tiny_llama.resolve()) and switched[-1].quantization == "int8"
    assert window.model_bar.model_box.currentText() == "llama" and window.model_bar.quant_box.currentText() == "int8"


def test_any_failure_while_adding_is_shown_in_words(qtbot, tmp_path, monkeypatch):
    """Not only the engine's own errors: an unexpected exception from the library reaches the user too."""
    from PySide6.QtWidgets import QMessageBox

    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    library = ModelLibrary()
    dialog = ModelDialog(library, "none")
    qtbot.addWidget(dialog)
    shown = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: shown.append((title, text)))
    monkeypatch.setattr(library, "add", lambda spec: (_ for _ in ()).throw(ZeroDivisionError("division by zero")))
    assert dialog.add("whatever.gguf") is None
    assert shown == [("Can't add this model", "ZeroDivisionError: division by zero")]


def test_the_fit_is_estimated_off_the_gui_thread_once_per_choice(qtbot, tmp_path, monkeypatch, tiny_llama):
    import threading

    import app.dialogs.model_manager as model_dialog

    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    threads = []
    real = model_dialog.estimate_fit

    def recording(config):
        threads.append((threading.current_thread() is threading.main_thread(), config.quantization))
        return real(config)

    monkeypatch.setattr(model_dialog, "estimate_fit", recording)
    library = ModelLibrary()
    library.add(str(tiny_llama))
    dialog = ModelDialog(library, "none")
    qtbot.addWidget(dialog)
    with qtbot.wait_signal(dialog.fit_shown):
        pass
    for _ in range(3):  # back and forth: answered from what was estimated before
        with qtbot.wait_signal(dialog.fit_shown):
            dialog.table.selectRow(1)
        assert "Fits." in dialog.fit.text()
        with qtbot.wait_signal(dialog.fit_shown):
            dialog.table.selectRow(0)
        assert "Fits." in dialog.fit.text()
    assert threads == [(False, "none"), (False, "none")]


def test_a_model_that_cannot_be_estimated_says_why(qtbot, tmp_path, monkeypatch):
    import app.dialogs.model_manager as model_dialog
    from engine import ModelLoadError

    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(model_dialog, "estimate_fit", lambda config: (_ for _ in ()).throw(
        ModelLoadError("the file is truncated")))
    dialog = ModelDialog(ModelLibrary(), "none")
    qtbot.addWidget(dialog)
    with qtbot.wait_signal(dialog.fit_shown):
        pass
    assert dialog.fit.text() == "Can't be loaded: the file is truncated"
