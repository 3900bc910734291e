"""``make screenshots`` and ``python -m app.tools.ui_bench`` drive the window through its public API: run both on the
scripted engine, so a change to that API can't leave them broken until someone runs them by hand."""

from PySide6.QtGui import QImage

from app.tools import screenshots, ui_bench


def test_screenshots_writes_eleven_pictures_of_the_real_window(window, qloop, tmp_path):
    example = window.current
    shots = qloop.run_until_complete(screenshots.capture(window, tmp_path))
    assert [p.name for p in shots] == ["finished-replies.png", "main-light.png", "main-dark.png",
                                       "engine-panel.png", "engine-charts.png", "context-full.png",
                                       "model-manager.png", "model-manager-discover.png", "routed-reply.png",
                                       "routing-rules.png", "routing-evaluation.png"]
    routed = [m for m in window.store.thread(window.current) if m.role == "assistant"]
    assert [m.stats["route"]["by"] for m in routed] == ["router"]  # the Auto chat's reply went where routing said
    window.actions.open(example)
    for path in shots:
        image = QImage(str(path))
        assert image.width() > 100 and image.height() > 50, path.name
    asked = [m[-1]["content"] for m in window.bridge.requests]
    assert asked[:2] == [screenshots.QUESTION, screenshots.FOLLOW_UP]  # the replies were generated, not typed
    finished = [m for m in window.store.thread(window.current) if m.role == "assistant"]
    assert [m.text for m in finished] == ["Paris is the capital of France and a **lovely** city ."] * 2


def test_ui_bench_round_generates_in_several_chats(window, qloop):
    rate = qloop.run_until_complete(ui_bench.generate_round(window, panel_visible=False))
    assert rate > 0 and len(window.store.conversations()) == ui_bench.CHATS + 1
    assert not window.panel.isVisible()
