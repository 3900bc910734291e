"""What the window says about replies and the engine: the numbers under a finished reply (TTFT first), the
context meter (amber, then red near full), the device in words, and the load progress."""

import pytest

from app.data.store import Message
from app.transcript.view import ChatView, stats_line
from app.window.composer import Composer
from tests.helpers.fake_engine import fake_stats


def reply(**stats) -> Message:
    return Message(2, 1, 1, "assistant", "Paris.", 1.0, stats=stats)


def test_the_stats_line_puts_ttft_first_and_says_each_number():
    line = stats_line(reply(ttft_s=0.1234, output_tokens=48, decode_tokens_per_s=21.345, prompt_tokens=412,
                            cached_prompt_tokens=380, queue_time_s=0.003))
    assert line == "TTFT 123 ms · 48 tokens · 21.3 tok/s · 380 of 412 prompt tokens from cache · queued 3 ms"
    assert stats_line(reply(output_tokens=1)) == "1 tokens"  # one token: no rate, no TTFT recorded
    assert stats_line(reply(output_tokens=60, draft_tokens=50, accepted_draft_tokens=41)) == \
        "60 tokens · 41 of 50 drafted tokens kept"
    assert stats_line(reply()) == ""


def test_a_finished_reply_shows_its_ttft_under_it_and_a_streaming_one_does_not(window, qloop):
    import asyncio

    window.bridge.gate = asyncio.Event()
    task = window.send("Capital of France?")
    qloop.run_until_complete(asyncio.sleep(0.05))
    footer = window.chat.last_widget().footer
    assert footer.text() == "Writing…"
    window.bridge.gate.set()
    qloop.run_until_complete(task)
    assert footer.isVisible()
    words = len(window.bridge.words)
    assert footer.text() == (f"TTFT 50 ms · {words} tokens · 25.0 tok/s · 32 of 40 prompt tokens from cache · "
                             "queued 1 ms")


def test_a_stopped_reply_says_so_after_its_numbers(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.show_thread([Message(1, 1, None, "user", "hi", 0.0),
                      Message(2, 1, 1, "assistant", "Par", 1.0, status="stopped",
                              stats={"ttft_s": 0.2, "output_tokens": 1})])
    assert view.message_widget(2).footer.text() == ("TTFT 200 ms · 1 tokens · Stopped — the text above is what had "
                                                    "arrived.")


@pytest.mark.parametrize("used, level, colour, words", [
    (100, "ok", "", None),
    (1_700, "warn", "#b06000", "83% of the context used"),
    (2_000, "full", "#c0392b", "nearly full"),
])
def test_the_context_meter_warns_as_the_context_fills(qtbot, used, level, colour, words):
    composer = Composer()
    qtbot.addWidget(composer)
    composer.set_context(used, 2_048)
    text = composer.context.text()
    assert text.startswith(f"{used:,} / 2,048 tokens") and composer.context_level == level
    assert (colour in composer.context.styleSheet()) if colour else composer.context.styleSheet() == ""
    assert (words in text) if words else text == f"{used:,} / 2,048 tokens"
    assert composer.context.accessibleDescription() == f"{used / 2048:.0%} of the model's context is used"


def test_the_context_meter_in_the_window_counts_the_chat(window, qloop):
    qloop.run_until_complete(window.send("one two three"))
    qloop.run_until_complete(window.meter.task)
    expected = window.bridge.count_tokens(window.controller.messages_for_model(window.current))
    assert window.composer.context.text() == f"{expected:,} / 2,048 tokens"
    window.bridge._stats = fake_stats(max_model_len=expected)  # a model whose context this chat fills
    window.bridge.loaded.emit(window.bridge._stats)
    qloop.run_until_complete(window.meter.task)
    assert window.composer.context_level == "full"


def test_the_device_label_says_where_the_model_runs_and_why(window):
    label = window.model_bar.device_label
    window.bridge.stats_updated.emit(fake_stats(device="cuda", device_reason="NVIDIA H200, 139 GiB"))
    assert label.text() == "CUDA · NVIDIA H200, 139 GiB"
    window.bridge.stats_updated.emit(fake_stats())
    assert label.text() == "CPU · no CUDA GPU found"
    window.bridge.fail("the engine thread died")
    assert label.text() == "engine stopped"


def test_the_load_progress_shows_the_phase_and_hides_when_loaded(window):
    bar = window.model_bar.progress
    assert not bar.isVisible()
    window.bridge.load_progress.emit(0.0, "Reading the model file")
    assert bar.isVisible() and bar.value() == 0
    window.bridge.load_progress.emit(0.42, "Packing weights")
    assert bar.value() == 42 and bar.text() == "42%" and window.model_bar.phase.text() == "Packing weights"
    assert bar.accessibleName() == "Model loading" and bar.accessibleDescription() == "Packing weights"
    assert window.model_bar.phase.isVisible()
    window.bridge.loaded.emit(fake_stats())
    assert not bar.isVisible() and not window.model_bar.phase.isVisible()
    window.bridge.load_progress.emit(0.5, "Packing weights")
    window.bridge.fail_load("out of memory")
    assert not bar.isVisible() and window.model_bar.device_label.text() == "no model loaded"


def test_every_size_is_written_one_way():
    from app.units import size_text

    assert [size_text(n) for n in (0, 812 * 1024, 103 * 1024**2 + 1024**2 // 2, 4_700_000_000, 2048 * 1024**3)] == [
        "0 KiB", "812 KiB", "103.5 MiB", "4.4 GiB", "2,048.0 GiB"]
