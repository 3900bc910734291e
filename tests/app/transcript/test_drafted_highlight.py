"""View > Highlight drafted words: a reply's words that came from kept draft tokens are stored with it and drawn
with a background while the highlight is on, as they stream and after; off by default, and remembered."""

import asyncio

from app.data.drafted_spans import KEPT_DRAFT_SPANS
from app.data.settings import Settings
from app.theme import DRAFTED
from tests.helpers.fake_engine import WORDS

KEPT = frozenset({1, 2, 5})  # "is", "the", "France"


def _word_spans(words, kept) -> list[list[int]]:
    spans, at = [], 0
    for i, word in enumerate(words):
        at += 0 if i == 0 else 1
        if i in kept:
            spans.append([at, at + len(word)])
        at += len(word)
    return spans


def _html(window, message_id: int) -> str:
    widget = window.chat.message_widget(message_id)
    return "".join(block.text() for block in widget._segments if hasattr(block, "text"))


def _highlighted(word: str) -> str:
    return f'<span style="background-color:{DRAFTED[0]};">{word}</span>'


def test_kept_drafts_are_stored_with_the_reply_and_highlighted_on_request(window, qloop, store):
    window.bridge.kept_words = KEPT
    qloop.run_until_complete(window.send("Tell me about Paris"))
    reply = store.thread(window.current)[-1]
    assert reply.stats[KEPT_DRAFT_SPANS] == _word_spans(WORDS, KEPT)
    assert [reply.text[a:b] for a, b in reply.stats[KEPT_DRAFT_SPANS]] == ["is", "the", "France"]
    assert DRAFTED[0] not in _html(window, reply.id)  # off by default

    window.commands["highlight_drafts"].setChecked(True)
    page = _html(window, reply.id)
    assert all(_highlighted(w) in page for w in ("is", "the", "France"))
    assert _highlighted("capital") not in page and "capital" in page
    assert Settings(window.settings.path)["highlight_drafts"] is True

    window.commands["highlight_drafts"].setChecked(False)
    assert DRAFTED[0] not in _html(window, reply.id)
    assert Settings(window.settings.path)["highlight_drafts"] is False


def test_the_highlight_follows_a_reply_as_it_streams(window, qloop, qtbot, store):
    window.bridge.kept_words = KEPT
    window.commands["highlight_drafts"].setChecked(True)
    window.bridge.gate = asyncio.Event()  # hold the reply after "Paris is"
    task = window.send("Tell me about Paris")
    qloop.run_until_complete(asyncio.sleep(0.01))
    reply = store.thread(window.current)[-1]
    qtbot.waitUntil(lambda: _highlighted("is") in _html(window, reply.id), timeout=60_000)
    window.bridge.gate.set()
    qloop.run_until_complete(task)
    assert _highlighted("France") in _html(window, reply.id)


def test_a_continued_reply_keeps_its_earlier_ranges_and_shifts_the_new_ones(window, qloop, store):
    bridge = window.bridge
    bridge.finish_reason, bridge.words, bridge.kept_words = "length", ["It", "was", "a"], frozenset({1})
    qloop.run_until_complete(window.send("Tell me a story"))
    reply = store.thread(window.current)[-1]
    bridge.finish_reason, bridge.words = "stop", [" dark", "night."]  # as a tokenizer spells it
    qloop.run_until_complete(window.flow.continue_reply(reply.id))
    continued = store.thread(window.current)[-1]
    assert continued.text == "It was a dark night."
    assert [continued.text[a:b] for a, b in continued.stats[KEPT_DRAFT_SPANS]] == ["was", "night."]
