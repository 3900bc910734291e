"""Where a chat's replies come from: a model of the local engine, or a model on a remote server.

:class:`ReplySources` is the one place that reads where a chat runs (its ``remote`` setting, and its
``local_model``: a resident model, or ``auto`` for the router's choice per message). Everything else asks it for
the chat's :class:`LocalSource` or :class:`RemoteSource` and uses what both offer: whether a reply can start now,
where a reply goes (:meth:`place`, with the routing decision), its stream, and whether the app checks the context
or the server does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine import Chat, SamplingParams
from engine.remote.client import ToolChoice
from engine.routing.router import AUTO, Request, Router

from ..data.remote_store import SETTING, RemoteChoice, choice_of
from ..data.tool_calls import REQUIRED
from ..engines.bridge import ChatEngine, not_ready_message
from ..engines.remote_engines import RemoteEngines
from .conversations import Conversations

# a chat's setting: {"model": spec, "quantization": q}, or "auto" (routed); absent: the model on screen
LOCAL_MODEL = "local_model"


@dataclass(frozen=True, slots=True)
class LocalModel:
    """The local model a chat runs on, as the model bar names it."""

    model: str
    quantization: str

    def to_setting(self) -> dict:
        return {"model": self.model, "quantization": self.quantization}


def local_model_of(settings: dict) -> LocalModel | str | None:
    """A chat's local model: a :class:`LocalModel`, ``AUTO``, or None (the model on screen)."""
    value = settings.get(LOCAL_MODEL)
    if value == AUTO:
        return AUTO
    if isinstance(value, dict) and isinstance(value.get("model"), str) and isinstance(value.get("quantization"), str):
        return LocalModel(value["model"], value["quantization"])
    return None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one reply is written: the resident model's id (None on a remote server), the names recorded with the
    reply, and for a routed chat how the model was chosen (kept in the reply's stats as ``route``)."""

    model: str | None
    model_name: str | None
    quantization: str | None
    route: dict | None = None  # {"model", "reason", "by": "router" | "you", "others": [the other resident ids]}


class LocalSource:
    """A model of the engine in this process, behind the bridge: the chat's own, the router's choice, or (a chat
    that names none) the one on screen."""

    remote: RemoteChoice | None = None
    checks_own_context = False  # the app counts the tokens and asks before the context overflows
    offers_tools = True  # the engine lays the MCP tools out for the model and parses its calls

    def __init__(self, bridge: ChatEngine, wanted: LocalModel | str | None = None,
                 router: Router | None = None) -> None:
        self.bridge, self.wanted, self.router = bridge, wanted, router

    @property
    def routed(self) -> bool:
        return self.wanted == AUTO

    @property
    def ready(self) -> bool:
        return self.bridge.ready and (not isinstance(self.wanted, LocalModel) or self.model() is not None)

    def not_ready_message(self) -> str:
        if self.bridge.ready:
            return f"This chat's model, {self.wanted.model} ({self.wanted.quantization}), is not loaded yet; " \
                   "your message is kept in the box."
        return not_ready_message(self.bridge)

    def model(self) -> str | None:
        """The resident model this chat's replies go to (None: its own model is not resident)."""
        if isinstance(self.wanted, LocalModel):
            return self.bridge.resident_id(self.wanted)
        return self.bridge.focused

    def offers_thinking_switch(self) -> bool:
        """Whether the model this chat's replies go to can be asked not to think (its template's switch)."""
        model = self.model()
        if model is None and isinstance(self.wanted, LocalModel):  # its own model is not loaded
            return False
        stats = self.bridge.stats(model)
        return bool(stats is not None and stats.thinking_switch)

    def place(self, messages: list[dict], chosen: str | None = None) -> Placement:
        """Where the reply to ``messages`` goes: ``chosen`` (a resident id the user picked for it), the router's
        choice for a routed chat, else the chat's model."""
        route = None
        if chosen is not None:
            model = chosen
            route = self._route(chosen, "chosen by you", "you")
            if self.routed:  # the conversation stays there, as it would had the router chosen it
                self.router.keep(Request.of(messages), chosen)
        elif self.routed:
            decision = self.router.route_on(self.bridge.engine, Request.of(messages))
            model, route = decision.model, self._route(decision.model, decision.reason, "router")
        else:
            model = self.model()
        stats = self.bridge.stats(model)
        return Placement(model, stats.model_name if stats else None, stats.quantization if stats else None, route)

    def _route(self, model: str, reason: str, by: str) -> dict:
        others = [i for i in self.bridge.resident if i != model]
        return {"model": model, "reason": reason, "by": by, "others": others}

    def stream(self, prompt: Chat, sampling: SamplingParams, placement: Placement, forced: str | None = None):
        """The reply to ``prompt``, its template options and earlier reasoning given to the model's template;
        where ``forced`` (``REQUIRED`` or a tool's name), held to that call by constrained decoding in the placed
        model's own tool-call format."""
        if forced is not None:
            name = None if forced == REQUIRED else forced
            structure = self.bridge.forced_call(prompt.tools, name, placement.model)
            sampling = dataclasses.replace(sampling, structure=structure)
        return self.bridge.stream(prompt, sampling, placement.model)


class RemoteSource:
    """A model on an OpenAI-compatible server."""

    checks_own_context = True  # the server refuses what does not fit, in its own words
    offers_tools = True  # sent as OpenAI's tools; the server parses the model's calls and streams them back
    routed = False
    ready = True  # a request that cannot reach it ends with the server's error on the reply

    def __init__(self, engines: RemoteEngines, choice: RemoteChoice) -> None:
        self.engines, self.remote = engines, choice

    def not_ready_message(self) -> str:
        return ""

    def offers_thinking_switch(self) -> bool:
        return False  # the request format has no place for the template's options

    def place(self, messages: list[dict], chosen: str | None = None) -> Placement:
        return Placement(None, self.engines.label(self.remote), None)

    def stream(self, prompt: Chat, sampling: SamplingParams, placement: Placement, forced: str | None = None):
        """The reply to ``prompt``'s messages and tools as OpenAI's format has them: without the replies'
        reasoning, which the format has no field for in a request (DeepSeek's API refuses a request that carries
        ``reasoning_content``), and without template options, which the server's template may not take; a
        ``forced`` call is asked for with ``tool_choice``."""
        chat = Chat([_as_sent_to_server(m) for m in prompt.messages], tools=prompt.tools)
        return self.engines.stream(self.remote, chat, sampling, _openai_tool_choice(forced))


def _as_sent_to_server(message: dict) -> dict:
    return {key: value for key, value in message.items() if key != "reasoning_content"}


def _openai_tool_choice(forced: str | None) -> ToolChoice:
    """OpenAI's ``tool_choice`` for a forced call (None: not sent, so the model decides)."""
    if forced is None or forced == REQUIRED:
        return forced
    return {"type": "function", "function": {"name": forced}}


class ReplySources:
    """Each chat's source of replies, and the one writer of where a chat runs."""

    def __init__(self, conversations: Conversations, bridge: ChatEngine, remote: RemoteEngines | None,
                 router: Router | None = None) -> None:
        self.conversations, self.bridge, self.remote = conversations, bridge, remote
        self.router = router or Router()
        self.local = LocalSource(bridge, None, self.router)  # the model on screen

    def of(self, conversation_id: int) -> LocalSource | RemoteSource:
        conversation = self.conversations.get(conversation_id)
        choice = choice_of(conversation) if self.remote is not None else None
        if choice is not None:
            return RemoteSource(self.remote, choice)
        return LocalSource(self.bridge, local_model_of(conversation.settings), self.router)

    def is_local(self, conversation_id: int) -> bool:
        return self.of(conversation_id).remote is None

    def run_on(self, conversation_id: int, choice: RemoteChoice | None) -> None:
        """Chat ``conversation_id`` runs on ``choice`` from now on (None: the local engine)."""
        self.conversations.set_setting(conversation_id, SETTING, choice.to_setting() if choice else None)

    def run_locally_on(self, conversation_id: int, model: LocalModel | str) -> None:
        """Chat ``conversation_id`` runs on the local ``model`` (or ``AUTO``: routed) from now on."""
        self.conversations.set_setting(conversation_id, SETTING, None)
        self.conversations.set_setting(conversation_id, LOCAL_MODEL,
                                       model if model == AUTO else model.to_setting())

    def placement(self, conversation_id: int | None) -> dict:
        """The settings that make a new chat run where ``conversation_id`` runs."""
        try:
            source = self.of(conversation_id) if conversation_id is not None else self.local
        except KeyError:  # that chat is gone
            return {}
        if source.remote is not None:
            return {SETTING: source.remote.to_setting()}
        return {LOCAL_MODEL: source.wanted if source.routed else source.wanted.to_setting()} if source.wanted else {}
