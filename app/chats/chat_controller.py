"""Sending messages and streaming replies into the store; several conversations may generate at once."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from PySide6.QtCore import QObject, Signal

from engine import Chat, SamplingParams

from ..data.drafted_spans import KEPT_DRAFT_SPANS
from ..data.reasoning import SECONDS, TOKENS, Reasoning
from ..data.settings import DEFAULTS
from ..data.store import Message, Status, StoreWriteError
from ..data.thinking import template_options
from ..data.tool_calls import AUTO, PENDING, pending_calls, tool_choice, tools_on, with_answers
from ..mcp.toolbox import McpToolbox
from .conversations import Conversations
from .reply_sources import Placement, ReplySources
from .tool_round import MAX_ROUNDS, ToolRound

SAVE_INTERVAL_S = 1.0  # a streaming reply is written to disk this often, so a crash keeps most of it
STOPPED_CALL = "not run: the reply was stopped"
STATUS_OF = {"stop": Status.COMPLETE, "length": Status.COMPLETE, "abort": Status.STOPPED, "error": Status.ERROR}


@dataclasses.dataclass(slots=True)
class ReplySoFar:
    """A reply being written: its answer and reasoning so far (a continued reply's earlier part included), the
    request's last output, and the earlier part's statistics."""

    text: str
    reasoning: str
    last: object = None  # RequestOutput
    earlier: dict | None = None

    def take(self, out, before: Message | None) -> None:
        """``out`` arrived: the whole text and reasoning so far, after the part written before (if any)."""
        self.text = (before.text if before else "") + out.text
        self.reasoning = (before.reasoning if before else "") + out.reasoning
        self.last = out

    def stats(self) -> dict:
        return _metrics(self.last, self.earlier, _offset(self.text, self.last))


class ChatController(QObject):
    """Turns user actions into engine requests and writes to the chats; views listen to its signals and to
    :class:`Conversations`'."""

    reply_started = Signal(int, int)  # conversation id, reply message id
    reply_delta = Signal(int, int, str)  # conversation id, reply message id, the text so far
    first_token = Signal(int, float)  # conversation id, time to first token (s), the moment it arrives
    reply_finished = Signal(int, object)  # conversation id, the stored Message
    reply_failed = Signal(int, str)  # conversation id, why no reply could be started (nothing was stored)

    def __init__(self, conversations: Conversations, sources: ReplySources, toolbox: McpToolbox | None = None,
                 parent=None) -> None:
        super().__init__(parent)
        self.conversations, self.sources = conversations, sources
        self.toolbox = toolbox if toolbox is not None else McpToolbox(parent=self)
        self.tool_round = ToolRound(conversations, self.toolbox)  # the window gives it a way to ask the user
        self.tasks: dict[int, asyncio.Task] = {}
        self.request_owners: dict[str, int] = {}  # engine request id -> conversation id
        self._unfinished: dict[int, ReplySoFar] = {}  # reply id -> what has arrived of it

    def is_generating(self, conversation_id: int) -> bool:
        return conversation_id in self.tasks

    def send(self, conversation_id: int, text: str) -> asyncio.Task:
        """Add the user's message to the thread and start the reply."""
        head = self.conversations.get(conversation_id).head_id
        if not self.conversations.thread(conversation_id):
            self.conversations.rename(conversation_id, _title_from(text))
        user = self.conversations.add_message(conversation_id, "user", text, parent_id=head)
        return self._start(conversation_id, user.id)

    def regenerate(self, conversation_id: int, model: str | None = None) -> asyncio.Task | None:
        """Write the last reply again (on the resident ``model`` where given: the user's override of the
        router); the old one stays as a previous version."""
        thread = self.conversations.thread(conversation_id)
        last_user = next((m for m in reversed(thread) if m.role == "user"), None)
        if last_user is None or self.is_generating(conversation_id):
            return None
        self.conversations.show_up_to(conversation_id, last_user.id)
        return self._start(conversation_id, last_user.id, chosen=model)

    def edit(self, conversation_id: int, message_id: int, text: str) -> asyncio.Task:
        """Replace a user message and what followed it; the old branch is kept as a previous version."""
        original = self.conversations.message(message_id)
        if original.role != "user":
            raise ValueError("only your own messages can be edited")
        edited = self.conversations.add_message(conversation_id, "user", text, parent_id=original.parent_id)
        return self._start(conversation_id, edited.id)

    def stop(self, conversation_id: int) -> None:
        task = self.tasks.get(conversation_id)
        if task is not None:
            task.cancel()

    def keep_unfinished_now(self) -> None:
        """The app is closing and its loop will not run the replies' own endings: store every reply being written
        as stopped, with its text so far, now."""
        for reply_id, reply in list(self._unfinished.items()):
            self.conversations.finish_message(reply_id, text=reply.text, reasoning=reply.reasoning,
                                              status=Status.STOPPED, error=None, stats=reply.stats())
        self._unfinished.clear()

    def live_kept_drafts(self, reply_id: int) -> list[list[int]]:
        """The kept drafts' character ranges of a reply being written (empty for any other)."""
        reply = self._unfinished.get(reply_id)
        if reply is None or reply.last is None:
            return []
        return kept_draft_spans(reply.last, reply.earlier, _offset(reply.text, reply.last))

    def live_reasoning(self, reply_id: int) -> Reasoning:
        """The reasoning so far of a reply being written (empty for any other)."""
        reply = self._unfinished.get(reply_id)
        if reply is None:
            return Reasoning()
        stats = reply.stats()
        thinking = reply.last is not None and not reply.last.text and bool(reply.last.reasoning)
        return Reasoning(reply.reasoning, stats.get(TOKENS) or 0, stats.get(SECONDS), thinking)

    def messages_for_model(self, conversation_id: int, next_user_text: str | None = None,
                           skipped: int | None = None) -> list[dict]:
        """The chat messages the model sees: the system prompt and the thread on screen, less any turns the
        user chose to drop when the context filled up (or the first ``skipped``); ``next_user_text`` is a
        message about to be sent. A reply's reasoning goes with it as ``reasoning_content``: the model's chat
        template decides whether the model reads it again."""
        conv = self.conversations.get(conversation_id)
        skipped = conv.settings.get("skip_messages", 0) if skipped is None else skipped
        thread = self.conversations.thread(conversation_id)[skipped:]
        if next_user_text is not None:
            thread = [*thread, Message(0, conversation_id, None, "user", next_user_text, 0.0)]
        system = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        sent = [m for m in thread if m.text or m.reasoning or m.tool_calls or m.role == "user"]
        return system + [message for m in sent for message in _for_model(m)]

    def prompt_for_model(self, conversation_id: int, next_user_text: str | None = None,
                         skipped: int | None = None) -> Chat:
        """What is sent for the next reply: :meth:`messages_for_model` with the chat's template options (its
        "Think before answering" switch) and the tools it offers (:meth:`tools_for`)."""
        options = template_options(self.conversations.get(conversation_id).settings)
        messages = self.messages_for_model(conversation_id, next_user_text, skipped)
        return Chat(messages, options, tools=self.tools_for(conversation_id))

    def tools_for(self, conversation_id: int) -> list[dict]:
        """The tools a chat's model is offered: the MCP servers' where the chat's Use tools switch is on and its
        source of replies offers tools (the local engine, and remote servers by OpenAI's ``tools``)."""
        wanted = tools_on(self.conversations.get(conversation_id).settings)
        return self.toolbox.tools() if wanted and self.sources.of(conversation_id).offers_tools else []

    def context_needed(self, conversation_id: int, next_user_text: str, count_tokens,
                       skipped: int | None = None) -> int:
        """Tokens the next request needs: its prompt plus the reply's max_tokens."""
        prompt = count_tokens(self.prompt_for_model(conversation_id, next_user_text, skipped))
        return prompt + self.sampling_for(conversation_id).max_tokens

    def drop_oldest_turns(self, conversation_id: int, next_user_text: str, count_tokens, limit: int) -> bool:
        """Stop sending the oldest turns (the system prompt stays) until the next request fits; False if even
        the new message alone would not fit."""
        original = self.conversations.get(conversation_id).settings.get("skip_messages", 0)
        skipped, visible = original, len(self.conversations.thread(conversation_id))
        while self.context_needed(conversation_id, next_user_text, count_tokens, skipped) > limit:
            if skipped >= visible:
                return False
            skipped += 2
        if skipped != original:
            self.conversations.set_skipped(conversation_id, skipped)
        return True

    def sampling_for(self, conversation_id: int) -> SamplingParams:
        settings = {**DEFAULTS["sampling"], **self.conversations.get(conversation_id).settings}
        chosen = {k: v for k, v in settings.items() if k in SamplingParams.__slots__}
        return SamplingParams(**chosen, parse_tool_calls=bool(self.tools_for(conversation_id)))

    def _forced_call(self, conversation_id: int) -> str | None:
        """The call the chat's tool choice holds a reply to: None (the model decides), ``REQUIRED`` (any offered
        tool) or the name of the one it picks; the reply's source holds it there."""
        names = [tool["function"]["name"] for tool in self.tools_for(conversation_id)]
        choice = tool_choice(self.conversations.get(conversation_id).settings, names) if names else AUTO
        return None if choice == AUTO else choice

    def _start(self, conversation_id: int, parent_id: int, continuing: Message | None = None,
               chosen: str | None = None) -> asyncio.Task:
        task = asyncio.ensure_future(self._generate(conversation_id, parent_id, continuing, chosen))
        self.tasks[conversation_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(conversation_id, None))
        return task

    def continue_reply(self, conversation_id: int, message_id: int) -> asyncio.Task | None:
        """Write on from where a reply stopped (at max_tokens): the model continues its own text, and the
        new words join the same message."""
        reply = self.conversations.message(message_id)
        thread = self.conversations.thread(conversation_id)
        if self.is_generating(conversation_id) or not thread or thread[-1].id != message_id or \
                reply.role != "assistant":
            return None
        return self._start(conversation_id, reply.parent_id, continuing=reply)

    async def _generate(self, conversation_id: int, parent_id: int, continuing: Message | None = None,
                        chosen: str | None = None) -> Message | None:
        """A reply and, while it ends asking for tools, the calls and the next reply (at most MAX_ROUNDS)."""
        stored = await self._reply(conversation_id, parent_id, continuing, chosen, first=continuing is None)
        for _round in range(MAX_ROUNDS):
            if not _asks_for_tools(stored):
                return stored
            try:
                await self.tool_round.run(conversation_id, stored)
            except asyncio.CancelledError:  # stopped while a call was asked about or ran: the rest never run
                self.tool_round.give_up(self.conversations.message(stored.id), STOPPED_CALL)
                raise
            stored = await self._reply(conversation_id, stored.id, None, chosen)
        if _asks_for_tools(stored):
            return self.tool_round.give_up(stored, f"not run: the reply already made {MAX_ROUNDS} rounds of tool "
                                                   "calls")
        return stored

    async def _reply(self, conversation_id: int, parent_id: int, continuing: Message | None = None,
                     chosen: str | None = None, first: bool = False) -> Message | None:
        """One reply, streamed into the store; its tool calls are stored with it, not run. ``first``: the reply to
        the user's message (the one the chat's tool choice can hold to a call)."""
        prompt = self.prompt_for_model(conversation_id)  # a continued reply is its last message
        source = self.sources.of(conversation_id)
        earlier_route = continuing.stats.get("route") if continuing is not None else None
        placement, refused = _place(source, prompt.messages, chosen, earlier_route)
        if continuing is None:
            try:
                reply = self.conversations.add_message(conversation_id, "assistant", "", parent_id=parent_id,
                                                       status=Status.PARTIAL, model=placement.model_name,
                                                       quantization=placement.quantization)
            except StoreWriteError as exc:  # no reply can be kept: none is started, and the user is told
                self.reply_failed.emit(conversation_id, f"No reply was started: {exc}.")
                return None
        else:
            reply = continuing
        so_far = self._unfinished[reply.id] = ReplySoFar(reply.text, reply.reasoning, None,
                                                          continuing.stats if continuing else None)
        self.reply_started.emit(conversation_id, reply.id)
        status, error, saved = Status.STOPPED, None, time.monotonic()
        try:
            if refused is not None:
                raise refused
            forced = self._forced_call(conversation_id) if first else None
            stream = source.stream(prompt, self.sampling_for(conversation_id), placement, forced)
            self.request_owners[stream.request_id] = conversation_id
            async for out in stream:
                if so_far.last is None and out.metrics.ttft_s is not None:
                    self.first_token.emit(conversation_id, out.metrics.ttft_s)
                so_far.take(out, continuing)
                self.reply_delta.emit(conversation_id, reply.id, so_far.text)
                if time.monotonic() - saved > SAVE_INTERVAL_S:
                    self.conversations.save_partial(reply.id, so_far.text, so_far.reasoning)
                    saved = time.monotonic()
            status, error = STATUS_OF[so_far.last.finish_reason], so_far.last.error
        except asyncio.CancelledError:
            status = Status.STOPPED
        except StoreWriteError as exc:  # a save on the way failed: the request is stopped, the text stays on screen
            status, error = Status.ERROR, f"the reply could not be saved: {exc}"
        except Exception as exc:  # the engine refused the request: say why, keep what arrived
            status, error = Status.ERROR, str(exc)
        finally:
            self._unfinished.pop(reply.id, None)
            self.request_owners = {r: c for r, c in self.request_owners.items() if c != conversation_id}
            metrics = so_far.stats()
            if placement.route is not None:
                metrics["route"] = placement.route
            calls = [*(continuing.tool_calls if continuing is not None else []),  # a continued reply keeps its own
                     *(pending_calls(so_far.last.tool_calls) if so_far.last is not None else [])]
            stored = self.conversations.finish_message(reply.id, text=so_far.text, reasoning=so_far.reasoning,
                                                       status=status, error=error, stats=metrics, tool_calls=calls)
            self.reply_finished.emit(conversation_id, stored)
        return stored


def _place(source, messages: list[dict], chosen: str | None,
           earlier_route: dict | None) -> tuple[Placement, Exception | None]:
    """Where the reply goes (a routed reply being continued: where it started, for the same reason); a placement
    with no model and the reason where that cannot be decided (the reply then ends with that reason)."""
    try:
        if earlier_route is not None and chosen is None:
            return dataclasses.replace(source.place(messages, earlier_route["model"]), route=earlier_route), None
        return source.place(messages, chosen), None
    except Exception as exc:  # the router found no model, or the chosen one was unloaded: the reply says so
        return Placement(None, None, None), exc


def _metrics(out, earlier: dict | None = None, offset: int = 0) -> dict:
    """A reply's numbers; for a continued reply (its new part starting at character ``offset``), its tokens count
    both parts."""
    if out is None:
        return dict(earlier or {})
    earlier = earlier or {}
    counts = {key: (earlier.get(key) or 0) + getattr(out.metrics, key)
              for key in ("output_tokens", "draft_tokens", "accepted_draft_tokens", TOKENS)}
    spans = kept_draft_spans(out, earlier, offset)
    return {**out.metrics.to_dict(), **counts, SECONDS: _seconds_thought(out, earlier),
            "finish_reason": out.finish_reason, **({KEPT_DRAFT_SPANS: spans} if spans else {})}


def _seconds_thought(out, earlier: dict) -> float | None:
    """Seconds a reply spent reasoning: the earlier part's and this request's, where either reasoned."""
    parts = [s for s in (earlier.get(SECONDS), out.metrics.reasoning_s) if isinstance(s, int | float)]
    return sum(parts) if parts else None


def _for_model(message: Message) -> list[dict]:
    """A stored message as the model's chat template reads it (a reply's tool calls with it, and their answers
    after it)."""
    sent = {"role": message.role, "content": message.text}
    if message.role == "assistant" and message.reasoning:
        sent["reasoning_content"] = message.reasoning
    return with_answers(sent, message.tool_calls if message.role == "assistant" else [])


def _asks_for_tools(reply: Message | None) -> bool:
    """Whether a stored reply ended whole with calls still to run."""
    return reply is not None and reply.status == Status.COMPLETE and \
        any(call.get("status") == PENDING for call in reply.tool_calls)


def _offset(text: str, last) -> int:
    """Where the text of the request behind ``last`` starts in the reply's ``text`` (after a continued reply's
    earlier part)."""
    return len(text) - len(last.text) if last is not None else 0


def kept_draft_spans(out, earlier: dict | None, offset: int) -> list[list[int]]:
    """The character ranges of a reply's text that came from kept draft tokens: the earlier part's, then
    ``out``'s (its text starting at ``offset``)."""
    return [*(earlier or {}).get(KEPT_DRAFT_SPANS, []),
            *([start + offset, end + offset] for start, end in out.kept_draft_spans)]


def _title_from(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "New chat"
    return line if len(line) <= 48 else line[:47] + "…"
