"""``make screenshots`` and ``python -m app.tools.ui_bench`` drive the window through its public API: run both on the
scripted engine, so a change to that API can't leave them broken until someone runs them by hand."""

from PySide6.QtGui import QImage

from app.tools import screenshots, ui_bench


def test_screenshots_writes_every_picture_of_the_real_window(window, qloop, tmp_path):
    example = window.current
    shots = qloop.run_until_complete(screenshots.capture(window, tmp_path))
    assert [p.name for p in shots] == ["finished-replies.png", "main-light.png", "main-dark.png",
                                       "engine-panel.png", "engine-charts.png", "context-full.png",
                                       "model-manager.png", "model-manager-discover.png", "routed-reply.png",
                                       "routing-rules.png", "routing-evaluation.png", "tool-approval.png",
                                       "tool-call.png", "reasoning-example.png"]
    assert [name for name, _model in window.bridge.forced] == ["count_letter"]  # the tool chat's reply held to it
    threads = [window.store.thread(c.id) for c in window.store.conversations()]
    replies = [m for thread in threads for m in thread if m.role == "assistant"]
    assert [[call["name"] for call in m.tool_calls] for m in replies if m.tool_calls] == [["count_letter"]]
    auto_chat = next(thread for thread in threads if thread[0].text == screenshots.ROUTED)
    routed = [m.stats["route"]["by"] for m in auto_chat if m.role == "assistant"]
    assert routed == ["router"]  # the Auto chat's reply went where routing said
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
