"""Save your own system prompt as a named persona: create, rename, delete, pick per chat; the built-in ones
stay read-only; chats keep their prompt whatever happens to the persona."""

import pytest

from app.data.personas import CUSTOM, PersonaError, Personas
from app.data.settings import DEFAULTS, Settings, load_presets
from app.dialogs.chat_settings import ChatSettingsDialog


@pytest.fixture
def personas(store, tmp_path):
    return Personas(store, load_presets(), Settings(tmp_path / "settings.json"))


def test_own_personas_follow_the_built_in_ones_and_say_when_they_change(personas):
    changes = []
    personas.changed.connect(lambda: changes.append(True))
    personas.save("  Pirate   captain ", "Talk like a pirate.")
    personas.save("Butler", "Very good, sir.")
    builtin = [p.name for p in load_presets()]
    assert personas.names() == builtin + ["Butler", "Pirate captain"] and len(changes) == 2
    assert personas.get("Butler").builtin is False and personas.get(builtin[0]).builtin is True
    personas.save("butler", "Certainly, madam.")  # the same persona (names ignore case): a new prompt
    assert personas.get("Butler").system_prompt == "Certainly, madam." and len(personas.all()) == len(builtin) + 2


@pytest.mark.parametrize("name, reason", [("", "needs a name"), ("   ", "needs a name"), ("x" * 61, "at most 60"),
                                          ("helpful ASSISTANT", "built-in"), ("custom", "reserved")])
def test_a_name_that_cant_be_used_is_refused_with_the_reason(personas, name, reason):
    with pytest.raises(PersonaError, match=reason):
        personas.save(name, "prompt")
    assert [p for p in personas.all() if not p.builtin] == []


def test_built_in_personas_cant_be_renamed_or_deleted(personas):
    with pytest.raises(PersonaError, match="built-in"):
        personas.rename("Concise", "Short")
    with pytest.raises(PersonaError, match="built-in"):
        personas.delete("Concise")
    with pytest.raises(PersonaError, match="no persona of yours"):
        personas.delete("Nobody")
    assert "Concise" in personas.names()


def test_renaming_follows_into_chats_and_the_default_and_deleting_falls_back(personas, store):
    personas.save("Pirate", "Arr.")
    personas.settings["preset"] = "Pirate"
    chat = store.create_conversation(system_prompt="Arr.", preset="Pirate")
    personas.save("Butler", "Sir.")
    with pytest.raises(PersonaError, match="already have"):
        personas.rename("Pirate", "BUTLER")
    personas.rename("Pirate", "Captain")
    assert store.conversation(chat.id).preset == "Captain"
    assert Settings(personas.settings.path)["preset"] == "Captain"  # saved: new chats start with it
    personas.delete("Captain")
    assert store.conversation(chat.id).preset is None and store.conversation(chat.id).system_prompt == "Arr."
    assert personas.settings["preset"] == DEFAULTS["preset"]


def dialog_for(qtbot, personas, preset=None, prompt="") -> ChatSettingsDialog:
    dialog = ChatSettingsDialog(personas, preset, prompt, DEFAULTS["sampling"])
    qtbot.addWidget(dialog)
    return dialog


def test_the_dialog_saves_renames_and_deletes_a_persona(qtbot, personas, monkeypatch):
    dialog = dialog_for(qtbot, personas, None, "Talk like a pirate.")
    assert dialog.preset.currentText() == CUSTOM and not dialog.delete_button.isEnabled()
    monkeypatch.setattr(dialog, "ask_name", lambda title, label, text: "Pirate")
    assert dialog.save_persona()
    assert dialog.preset.currentText() == "Pirate" and personas.get("Pirate").system_prompt == "Talk like a pirate."
    assert dialog.rename_button.isEnabled() and dialog.delete_button.isEnabled()
    assert dialog.result_values()["preset"] == "Pirate"
    monkeypatch.setattr(dialog, "ask_name", lambda title, label, text: "Captain" if text == "Pirate" else None)
    assert dialog.rename_persona() and dialog.preset.currentText() == "Captain" and "Pirate" not in personas.names()
    monkeypatch.setattr(dialog, "confirm", lambda question: "Captain" in question)
    assert dialog.delete_persona()
    assert dialog.preset.currentText() == CUSTOM and "Captain" not in personas.names()
    assert dialog.prompt.toPlainText() == "Talk like a pirate."  # what the user wrote stays in the box


def test_built_in_personas_offer_save_as_but_not_rename_or_delete(qtbot, personas, monkeypatch):
    dialog = dialog_for(qtbot, personas, "Concise", load_presets()[1].system_prompt)
    assert not dialog.rename_button.isEnabled() and not dialog.delete_button.isEnabled()
    assert "built-in" in dialog.note.text()
    warnings = []
    monkeypatch.setattr("app.dialogs.chat_settings.QMessageBox.warning",
                        lambda parent, title, text: warnings.append(text))
    monkeypatch.setattr(dialog, "ask_name", lambda title, label, text: "Concise")
    assert not dialog.save_persona()
    assert warnings and "built-in" in warnings[0] and personas.get("Concise").builtin


def test_replacing_an_own_persona_asks_first(qtbot, personas, monkeypatch):
    personas.save("Pirate", "Arr.")
    dialog = dialog_for(qtbot, personas, "Pirate", "Arr.")
    dialog.prompt.setPlainText("Arr, matey.")
    assert dialog.preset.currentText() == CUSTOM  # edited: no longer the saved persona
    monkeypatch.setattr(dialog, "ask_name", lambda title, label, text: "Pirate")
    monkeypatch.setattr(dialog, "confirm", lambda question: False)
    assert not dialog.save_persona() and personas.get("Pirate").system_prompt == "Arr."
    monkeypatch.setattr(dialog, "confirm", lambda question: True)
    assert dialog.save_persona() and personas.get("Pirate").system_prompt == "Arr, matey."


def test_a_saved_persona_can_be_picked_for_another_chat_and_reaches_the_model(window, qloop, monkeypatch):
    window.personas.save("Pirate", "Talk like a pirate.")
    window.actions.new()

    def pick_pirate(dialog):
        dialog.preset.setCurrentText("Pirate")
        return 1

    monkeypatch.setattr(ChatSettingsDialog, "exec", pick_pirate)
    window.pane.edit_chat_settings()
    chat = window.conversations.get(window.current)
    assert (chat.preset, chat.system_prompt) == ("Pirate", "Talk like a pirate.")
    assert window.pane.persona_button.text() == "Persona: Pirate"
    qloop.run_until_complete(window.send("Hello"))
    assert window.bridge.requests[-1][0] == {"role": "system", "content": "Talk like a pirate."}
    window.personas.rename("Pirate", "Captain")
    assert window.pane.persona_button.text() == "Persona: Captain"  # the header follows at once


def test_a_new_chat_starts_with_the_users_persona_when_it_is_the_default(window):
    window.personas.save("Pirate", "Arr.")
    window.settings["preset"] = "Pirate"
    chat = window.actions.new()
    assert (chat.preset, chat.system_prompt) == ("Pirate", "Arr.")
