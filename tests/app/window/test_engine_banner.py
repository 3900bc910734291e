"""When the engine dies or the model does not load: a lasting bar says why and offers a way out."""

import asyncio

from PySide6.QtCore import Qt

from app.dialogs.model_manager import ModelDialog


def test_a_dying_engine_ends_the_reply_with_its_reason_and_shows_the_bar(qtbot, window, qloop, store):
    window.bridge.gate = asyncio.Event()  # the reply is mid-way when the engine dies
    task = window.send("Tell me about Paris")
    qloop.run_until_complete(asyncio.sleep(0.05))
    assert not window.banner.isVisible()
    with qtbot.wait_signal(window.controller.reply_finished, timeout=5000) as finished:
        window.bridge.fail("CUDA error: an illegal memory access was encountered")
        qloop.run_until_complete(task)
    _, reply = finished.args
    assert reply.status == "error" and reply.text == "Paris is"
    assert reply.error == "CUDA error: an illegal memory access was encountered"
    stored = store.thread(window.current)
    assert [m.text for m in stored] == ["Tell me about Paris", "Paris is"] and stored[-1].status == "error"
    assert "Failed: CUDA error: an illegal memory access" in window.chat.toPlainText()
    assert window.banner.isVisible() and "engine stopped" in window.banner.title.text()
    assert "illegal memory access" in window.banner.reason.text()
    assert window.model_bar.device_label.text() == "engine stopped"
    assert window.composer.button.text() == "Send"


def test_the_bar_lasts_and_sending_keeps_the_message(qtbot, window, qloop):
    window.bridge.fail("the engine stopped: out of memory")
    qtbot.keyClicks(window.composer.edit, "are you there?")
    qtbot.keyClick(window.composer.edit, Qt.Key_Return)
    assert window.composer.edit.toPlainText() == "are you there?"
    assert "engine has stopped" in window.statusBar().currentMessage()
    qtbot.wait(50)  # the bar is not a status message that times out; a moment later it is still there
    assert window.banner.isVisible()


def test_restart_engine_brings_replies_back(qtbot, window, qloop, store):
    window.bridge.fail("the engine stopped: out of memory")
    with qtbot.wait_signal(window.bridge.loaded, timeout=2000):
        qtbot.mouseClick(window.banner.restart, Qt.LeftButton)
    assert window.bridge.restarts == 1 and not window.banner.isVisible()
    message = qloop.run_until_complete(window.send("hello again"))
    assert message.status == "complete" and message.text.startswith("Paris is the capital")


def test_a_failed_first_load_shows_the_reason_and_a_way_to_pick_another_model(qtbot, window, qloop):
    window.bridge.fail_load("config.json: no 'model_type' in it")
    assert window.banner.isVisible() and "could not be loaded" in window.banner.title.text()
    assert "no 'model_type'" in window.banner.reason.text()
    assert window.model_bar.device_label.text() == "no model loaded"
    qtbot.mouseClick(window.banner.choose, Qt.LeftButton)
    dialog = window.findChild(ModelDialog)
    assert dialog is not None and dialog.isVisible()
    with qtbot.wait_signal(window.bridge.loaded, timeout=2000):
        dialog.load.click()
        qloop.run_until_complete(asyncio.sleep(0.01))
    assert not window.banner.isVisible()


def test_a_failed_switch_keeps_the_old_model_and_no_bar(window):
    window.bridge.load_failed.emit("the new model is too big")  # the previous engine still serves
    assert not window.banner.isVisible()
    assert "too big" in window.statusBar().currentMessage()


def test_the_bar_reads_well(window, qapp):
    """Rendered once: the reason wraps inside the bar, and both buttons are visible."""
    window.resize(1280, 800)
    window.bridge.fail("the engine stopped: RuntimeError: CUDA error: an illegal memory access was encountered "
                       "(in the forward pass of layer 11)")
    qapp.processEvents()  # let the layout take the new texts in, as the event loop would
    image = window.grab()
    image.save("/tmp/banner.png")
    assert not image.isNull()
    assert window.banner.restart.isVisible() and window.banner.choose.isVisible()
    restart = window.banner.restart
    assert window.banner.reason.width() > 400 and restart.width() >= restart.sizeHint().width()
