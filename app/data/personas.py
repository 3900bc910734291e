"""Personas: the built-in system prompts (read-only, from ``app/assets/presets.json``) and the user's own, saved
by name in the chat database. Chats remember a persona by name and keep their own copy of its prompt, so
renaming one renames it in its chats and deleting one leaves them their prompt."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from .settings import DEFAULTS, Preset, Settings
from .store import Store

MAX_NAME_LENGTH = 60
CUSTOM = "Custom"  # what the chat settings call a prompt for one chat alone: no persona may take the name


class PersonaError(ValueError):
    """A persona can't be saved, renamed or deleted as asked; the message says why."""


class Personas(QObject):
    """Every persona, built-in first. Writes go to the store; ``changed`` says the list changed."""

    changed = Signal()

    def __init__(self, store: Store, builtin: list[Preset], settings: Settings | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store, self.settings = store, settings
        self.builtin = [Preset(p.name, p.system_prompt, builtin=True) for p in builtin]

    def all(self) -> list[Preset]:
        """The built-in personas in their shipped order, then the user's by name."""
        return self.builtin + [Preset(name, prompt, builtin=False) for name, prompt in self.store.personas()]

    def names(self) -> list[str]:
        return [p.name for p in self.all()]

    def get(self, name: str | None) -> Preset | None:
        return next((p for p in self.all() if p.name == name), None)

    def is_own(self, name: str | None) -> bool:
        """Whether ``name`` is one of the user's personas (which may be renamed and deleted)."""
        persona = self.get(name)
        return persona is not None and not persona.builtin

    def save(self, name: str, system_prompt: str) -> Preset:
        """Save ``system_prompt`` as the user's persona ``name`` (replacing the prompt of one so named)."""
        name = self._checked_name(name, allow=name)
        self.store.save_persona(name, system_prompt)
        self.changed.emit()
        return self.get(name) or Preset(name, system_prompt, builtin=False)

    def rename(self, old: str, new: str) -> None:
        """Rename the user's persona ``old``; its chats, and the default for new chats, follow."""
        self._own(old)
        new = self._checked_name(new, allow=old)
        if new == old:
            return
        self.store.rename_persona(old, new)
        if self.settings is not None and self.settings["preset"] == old:
            self._set_default(new)
        self.changed.emit()

    def delete(self, name: str) -> None:
        """Delete the user's persona ``name``; its chats keep their prompt, new chats get the default one."""
        self._own(name)
        self.store.delete_persona(name)
        if self.settings is not None and self.settings["preset"] == name:
            self._set_default(DEFAULTS["preset"])
        self.changed.emit()

    def _own(self, name: str) -> None:
        if not self.is_own(name):
            kind = "a built-in persona, which can't be changed" if self.get(name) else "no persona of yours"
            raise PersonaError(f"“{name}” is {kind}.")

    def _checked_name(self, name: str, allow: str | None) -> str:
        """``name`` stripped, or :class:`PersonaError`: empty, too long, or taken (``allow`` may keep its own)."""
        name = " ".join(name.split())
        if not name:
            raise PersonaError("A persona needs a name.")
        if len(name) > MAX_NAME_LENGTH:
            raise PersonaError(f"A persona's name can be at most {MAX_NAME_LENGTH} characters long.")
        if name.casefold() == CUSTOM.casefold():
            raise PersonaError(f"“{CUSTOM}” is reserved for a chat's own prompt; choose another name.")
        taken = next((p for p in self.all() if p.name.casefold() == name.casefold()), None)
        if taken is not None and taken.builtin:
            raise PersonaError(f"“{taken.name}” is a built-in persona; choose another name.")
        if taken is not None and (allow is None or taken.name.casefold() != allow.casefold()):
            raise PersonaError(f"You already have a persona called “{taken.name}”.")
        return name

    def _set_default(self, name: str) -> None:
        self.settings["preset"] = name
        self.settings.save()
