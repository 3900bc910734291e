"""Personas and sampling per chat, preferences, themes, and what happens when the context is full."""

import json

import pytest

from app.data.personas import CUSTOM
from app.data.settings import DEFAULTS, Settings, SettingsError, load_presets
from app.dialogs.chat_settings import ChatSettingsDialog
from tests.helpers.fake_engine import fake_stats


def test_presets_ship_with_the_app():
    presets = {p.name: p.system_prompt for p in load_presets()}
    assert "Helpful assistant" in presets and presets["No system prompt"] == ""
    assert len(presets) >= 4


def test_settings_merge_saved_values_over_defaults(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "dark", "sampling": {"temperature": 0.2, "bogus": 1}, "unknown": 3}))
    settings = Settings(path)
    assert settings["theme"] == "dark" and settings["sampling"]["temperature"] == 0.2
    assert settings["sampling"]["top_p"] == DEFAULTS["sampling"]["top_p"] and "bogus" not in settings["sampling"]
    settings["preset"] = "Concise"
    settings.save()
    assert Settings(path)["preset"] == "Concise"
    path.write_text("{damaged")
    with pytest.raises(SettingsError, match="not readable JSON"):
        Settings(path)  # the app offers to move the file aside (see tests/app/startup/test_checks.py)


def test_new_chats_start_with_the_default_persona_and_sampling(window, qloop, store):
    conv = store.conversation(window.current)
    assert conv.preset == "Helpful assistant" and conv.system_prompt.startswith("You are Kvasir")
    assert conv.settings["temperature"] == DEFAULTS["sampling"]["temperature"]
    qloop.run_until_complete(window.send("hi"))
    assert window.bridge.requests[-1][0] == {"role": "system", "content": conv.system_prompt}
    assert "Persona: Helpful assistant" in window.pane.persona_button.text()


def test_chat_settings_dialog_choose_preset_then_customise(qtbot, store):
    from app.data.personas import Personas

    presets = load_presets()
    dialog = ChatSettingsDialog(Personas(store, presets), "Helpful assistant", presets[0].system_prompt,
                                DEFAULTS["sampling"])
    qtbot.addWidget(dialog)
    dialog.preset.setCurrentText("Concise")
    assert dialog.prompt.toPlainText() == next(p.system_prompt for p in presets if p.name == "Concise")
    dialog.prompt.setPlainText("Talk like a pirate.")
    dialog.sampling.temperature.setValue(0.0)
    dialog.sampling.fixed_seed.setChecked(True)
    dialog.sampling.seed.setValue(42)
    values = dialog.result_values()
    assert values["preset"] is None and dialog.preset.currentText() == CUSTOM
    assert values["system_prompt"] == "Talk like a pirate."
    assert values["settings"]["temperature"] == 0.0 and values["settings"]["seed"] == 42


def test_chat_sampling_settings_reach_the_engine(window, store):
    store.update_conversation(window.current, settings={"temperature": 0.0, "top_k": 5, "max_tokens": 77,
                                                        "seed": 9, "skip_messages": 0})
    params = window.controller.sampling_for(window.current)
    assert (params.temperature, params.top_k, params.max_tokens, params.seed) == (0.0, 5, 77, 9)


def test_full_context_drop_oldest_turns_keeps_the_system_prompt(window, qloop, store, monkeypatch):
    for text in ("one", "two", "three"):
        qloop.run_until_complete(window.send(text))
    conv = window.current
    limit = window.controller.context_needed(conv, "four", window.bridge.count_tokens) - 10
    window.bridge._stats = fake_stats(max_model_len=limit)
    monkeypatch.setattr(window.flow.dialogs, "ask_overflow", lambda overflow: "drop")
    qloop.run_until_complete(window.send("four"))
    sent = window.bridge.requests[-1]
    assert sent[0]["role"] == "system" and sent[1]["content"] != "one"
    assert sent[-1]["content"] == "four"
    assert [m.text for m in store.thread(conv)][0] == "one"  # nothing the user wrote is deleted
    assert "no longer sent to the model" in window.chat.toPlainText()


def test_full_context_start_a_new_chat(window, qloop, store, monkeypatch):
    qloop.run_until_complete(window.send("a long conversation"))
    old = window.current
    window.bridge._stats = fake_stats(max_model_len=window.controller.context_needed(
        old, "next", window.bridge.count_tokens) - 1)
    monkeypatch.setattr(window.flow.dialogs, "ask_overflow", lambda overflow: "new")
    qloop.run_until_complete(window.send("next"))
    assert window.current != old
    assert [m.text for m in store.thread(window.current)][0] == "next"
    assert store.conversation(window.current).system_prompt == store.conversation(old).system_prompt


def test_cancelled_overflow_keeps_the_text(qtbot, window, monkeypatch):
    window.bridge._stats = fake_stats(max_model_len=10)
    monkeypatch.setattr(window.flow.dialogs, "ask_overflow", lambda overflow: None)
    window.composer.edit.setPlainText("too long for ten tokens of context")
    window.composer._submit()
    assert window.composer.edit.toPlainText() == "too long for ten tokens of context"
    assert window.bridge.requests == []


def test_dark_theme_changes_the_palette_and_the_code_colours(window, qapp):
    window.apply_theme("dark")
    assert qapp.palette().window().color().lightness() < 80 and window.chat.renderer.dark
    window.apply_theme("light")
    assert qapp.palette().window().color().lightness() > 180 and not window.chat.renderer.dark
