"""The app's model layer: every read and write of chats goes through here, and every write says what changed.

Views listen instead of being refreshed by hand (qutebrowser's completion models work the same way):

- ``list_changed``: the sidebar's rows changed (a chat added, removed, renamed, pinned, or moved to the top by a
  new message);
- ``thread_changed(id)``: the messages on screen changed (one added or finished, another version selected,
  older turns left out of the context);
- ``conversation_changed(id)``: its persona or sampling settings changed.

Threads are cached until they change, so one send reads the database once. A streaming reply's periodic
saves (:meth:`Conversations.save_partial`) say nothing: the view already shows that text live.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from ..data.store import Conversation, Message, Status, Store, StoreWriteError


class Conversations(QObject):
    """Chats and their messages over a :class:`Store`, with change signals."""

    list_changed = Signal()
    thread_changed = Signal(int)
    conversation_changed = Signal(int)

    def __init__(self, store: Store, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._threads: dict[int, list[Message]] = {}
        self._versions: dict[int, dict[int, tuple[int, int]]] = {}  # cleared when messages are added

    # -- reads ----------------------------------------------------------------------------------------

    def get(self, conversation_id: int) -> Conversation:
        return self.store.conversation(conversation_id)

    def all(self) -> list[Conversation]:
        """Live chats: pinned first, then the most recently updated."""
        return self.store.conversations()

    def thread(self, conversation_id: int) -> list[Message]:
        """The messages on screen, oldest first (a copy of the cached list)."""
        if conversation_id not in self._threads:
            self._threads[conversation_id] = self.store.thread(conversation_id)
        return list(self._threads[conversation_id])

    def message(self, message_id: int) -> Message:
        return self.store.message(message_id)

    def versions(self, message_id: int) -> list[Message]:
        """Every version of a message (edits, regenerated replies), oldest first."""
        return self.store.siblings(message_id)

    def version_positions(self, conversation_id: int) -> dict[int, tuple[int, int]]:
        """For each message on screen that has other versions: (its number, how many there are)."""
        if conversation_id not in self._versions:
            self._versions[conversation_id] = self._count_versions(conversation_id)
        return dict(self._versions[conversation_id])

    def _count_versions(self, conversation_id: int) -> dict[int, tuple[int, int]]:
        families: dict[tuple, list[int]] = {}  # versions share their parent and role; one query for all
        for message in self.store.all_messages(conversation_id):
            families.setdefault((message.parent_id, message.role), []).append(message.id)
        positions = {}
        for message in self.thread(conversation_id):
            ids = families[(message.parent_id, message.role)]
            if len(ids) > 1:
                positions[message.id] = (ids.index(message.id) + 1, len(ids))
        return positions

    def search(self, query: str, limit: int = 500) -> set[int]:
        """Ids of the chats whose title or a message contains ``query``."""
        return {conversation.id for conversation, _ in self.store.search(query, limit=limit)}

    # -- chats ----------------------------------------------------------------------------------------

    def create(self, title: str = "New chat", system_prompt: str = "", preset: str | None = None,
               settings: dict | None = None) -> Conversation:
        conversation = self.store.create_conversation(title, system_prompt, preset, settings)
        self.list_changed.emit()
        return conversation

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.update_conversation(conversation_id, title=title)
        self.list_changed.emit()

    def set_pinned(self, conversation_id: int, pinned: bool) -> None:
        self.store.update_conversation(conversation_id, pinned=pinned)
        self.list_changed.emit()

    def configure(self, conversation_id: int, preset: str | None, system_prompt: str, settings: dict) -> None:
        """Persona and sampling of a chat."""
        self.store.update_conversation(conversation_id, preset=preset, system_prompt=system_prompt,
                                       settings=settings)
        self.conversation_changed.emit(conversation_id)

    def set_setting(self, conversation_id: int, key: str, value) -> None:
        """Set (or, with ``None``, remove) one of a chat's settings, such as the remote model it runs on."""
        settings = dict(self.get(conversation_id).settings)
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = value
        self.store.update_conversation(conversation_id, settings=settings)
        self.conversation_changed.emit(conversation_id)

    def set_skipped(self, conversation_id: int, count: int) -> None:
        """Leave the first ``count`` messages out of what the model reads (they stay on screen, greyed)."""
        settings = dict(self.get(conversation_id).settings)
        settings["skip_messages"] = count
        self.store.update_conversation(conversation_id, settings=settings)
        self._changed_thread(conversation_id)

    def delete(self, conversation_id: int) -> None:
        """Hide a chat; :meth:`restore` brings it back."""
        self.store.delete_conversation(conversation_id)
        self._threads.pop(conversation_id, None)
        self._versions.pop(conversation_id, None)
        self.list_changed.emit()

    def restore(self, conversation_id: int) -> None:
        self.store.undelete_conversation(conversation_id)
        self.list_changed.emit()

    def added_elsewhere(self) -> None:
        """Chats or messages were written to the store directly (an import): forget the cache, tell the views."""
        self._threads.clear()
        self._versions.clear()
        self.list_changed.emit()

    # -- messages -------------------------------------------------------------------------------------

    def add_message(self, conversation_id: int, role: str, text: str, parent_id: int | None = None,
                    **extra) -> Message:
        """Append a message under ``parent_id``; it becomes the last one on screen."""
        message = self.store.add_message(conversation_id, role, text, parent_id=parent_id, **extra)
        self._changed_thread(conversation_id)
        self.list_changed.emit()  # the chat moves to the top
        return message

    def save_partial(self, message_id: int, text: str, reasoning: str = "") -> None:
        """Keep a streaming reply's text and reasoning so far (a crash loses at most a second of them); no
        signal."""
        message = self.store.update_message(message_id, text=text, reasoning=reasoning)
        cached = self._threads.get(message.conversation_id)
        if cached is not None:
            self._threads[message.conversation_id] = [message if m.id == message_id else m for m in cached]

    def finish_message(self, message_id: int, **fields) -> Message:
        """Store a reply's final text, status and statistics (the cached thread is updated in place: nothing
        else changed). When the write fails (a full disk), the reply still ends: on screen, with its text and
        the reason it was not kept, and the message returned says so."""
        try:
            message = self.store.update_message(message_id, **fields)
        except StoreWriteError as exc:
            message = replace(self.store.message(message_id), **{
                **fields, "status": Status.ERROR, "error": f"the reply could not be saved: {exc}"})
        cached = self._threads.get(message.conversation_id)
        if cached is not None:
            self._threads[message.conversation_id] = [message if m.id == message_id else m for m in cached]
        self.thread_changed.emit(message.conversation_id)
        return message

    def show_branch(self, message_id: int) -> None:
        """Show the branch through ``message_id`` (another version of a message and the turns after it)."""
        self.store.select_branch(message_id)
        self._changed_thread(self.message(message_id).conversation_id)

    def show_up_to(self, conversation_id: int, message_id: int) -> None:
        """Make ``message_id`` the last message on screen (before a reply is written again)."""
        self.store.update_conversation(conversation_id, head_id=message_id)
        self._changed_thread(conversation_id)

    def _changed_thread(self, conversation_id: int) -> None:
        self._threads.pop(conversation_id, None)
        self._versions.pop(conversation_id, None)
        self.thread_changed.emit(conversation_id)
