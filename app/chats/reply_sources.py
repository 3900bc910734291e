"""Where a chat's replies come from: the local engine, or a model on a remote server.

:class:`ReplySources` is the one place that reads where a chat runs (its ``remote`` setting). Everything else
asks it for the chat's :class:`LocalSource` or :class:`RemoteSource` and uses what both offer: whether a reply
can start now, the stream of a reply, the model's name to record with it, and whether the app checks the
context or the server does.
"""

from __future__ import annotations

from engine import SamplingParams

from ..data.remote_store import SETTING, RemoteChoice, choice_of
from ..engines.bridge import ChatEngine, not_ready_message
from ..engines.remote_engines import RemoteEngines
from .conversations import Conversations


class LocalSource:
    """The engine in this process, behind the bridge."""

    remote: RemoteChoice | None = None
    checks_own_context = False  # the app counts the tokens and asks before the context overflows

    def __init__(self, bridge: ChatEngine) -> None:
        self.bridge = bridge

    @property
    def ready(self) -> bool:
        return self.bridge.ready

    def not_ready_message(self) -> str:
        return not_ready_message(self.bridge)

    def stream(self, messages: list[dict], sampling: SamplingParams):
        return self.bridge.stream(messages, sampling)

    def model_names(self) -> tuple[str | None, str | None]:
        """The model and quantisation a reply is written by."""
        stats = self.bridge.stats()
        return (stats.model_name, stats.quantization) if stats else (None, None)


class RemoteSource:
    """A model on an OpenAI-compatible server."""

    checks_own_context = True  # the server refuses what does not fit, in its own words
    ready = True  # a request that cannot reach it ends with the server's error on the reply

    def __init__(self, engines: RemoteEngines, choice: RemoteChoice) -> None:
        self.engines, self.remote = engines, choice

    def not_ready_message(self) -> str:
        return ""

    def stream(self, messages: list[dict], sampling: SamplingParams):
        return self.engines.stream(self.remote, messages, sampling)

    def model_names(self) -> tuple[str | None, str | None]:
        return self.engines.label(self.remote), None


class ReplySources:
    """Each chat's source of replies, and the one writer of where a chat runs."""

    def __init__(self, conversations: Conversations, bridge: ChatEngine, remote: RemoteEngines | None) -> None:
        self.conversations, self.local, self.remote = conversations, LocalSource(bridge), remote

    def of(self, conversation_id: int) -> LocalSource | RemoteSource:
        choice = choice_of(self.conversations.get(conversation_id)) if self.remote is not None else None
        return self.local if choice is None else RemoteSource(self.remote, choice)

    def is_local(self, conversation_id: int) -> bool:
        return self.of(conversation_id).remote is None

    def run_on(self, conversation_id: int, choice: RemoteChoice | None) -> None:
        """Chat ``conversation_id`` runs on ``choice`` from now on (None: the local engine)."""
        self.conversations.set_setting(conversation_id, SETTING, choice.to_setting() if choice else None)

    def placement(self, conversation_id: int | None) -> dict:
        """The settings that make a new chat run where ``conversation_id`` runs (nothing for the local engine)."""
        try:
            choice = self.of(conversation_id).remote if conversation_id is not None else None
        except KeyError:  # that chat is gone
            return {}
        return {SETTING: choice.to_setting()} if choice else {}
