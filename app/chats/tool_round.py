"""A round of tool calls: the calls a reply asked for, each asked about (unless the chat allows its tool), run
through the MCP toolbox, and stored with the reply as it ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..data.store import Message
from ..data.tool_calls import ALLOWED, FAILED, PENDING, REFUSED, REFUSED_TEXT, allowed
from ..mcp.toolbox import McpToolbox
from .conversations import Conversations

RUN, ALWAYS, REFUSE = "run", "always", "refuse"  # the user's answers to "run this call?"
MAX_ROUNDS = 8  # rounds of calls one message may lead to before the replies stop asking for more

# asks the user whether to run a call (conversation id, the stored call): RUN, ALWAYS (this tool, in this chat) or
# REFUSE
Approver = Callable[[int, dict], Awaitable[str]]


async def refuse_all(conversation_id: int, call: dict) -> str:
    """The approver where no one can be asked."""
    return REFUSE


class ToolRound:
    """Ends every pending call of a reply, one after the other, storing each ending at once."""

    def __init__(self, conversations: Conversations, toolbox: McpToolbox, approve: Approver = refuse_all) -> None:
        self.conversations, self.toolbox, self.approve = conversations, toolbox, approve

    async def run(self, conversation_id: int, reply: Message) -> Message:
        """Run ``reply``'s pending calls; the reply as stored with their endings."""
        calls = [dict(call) for call in reply.tool_calls]
        for call in calls:
            if call.get("status") == PENDING:
                call.update(await self._end(conversation_id, call))
                reply = self.conversations.finish_message(reply.id, tool_calls=calls)
        return reply

    def give_up(self, reply: Message, reason: str) -> Message:
        """End ``reply``'s pending calls without running them, for ``reason``."""
        calls = [{**c, "status": FAILED, "result": reason} if c.get("status") == PENDING else c
                 for c in reply.tool_calls]
        return self.conversations.finish_message(reply.id, tool_calls=calls)

    async def _end(self, conversation_id: int, call: dict) -> dict:
        if self.toolbox.knows(call["name"]) and await self._ask(conversation_id, call) == REFUSE:
            return {"status": REFUSED, "result": REFUSED_TEXT}
        outcome = await self.toolbox.call(call["name"], call["arguments"])
        return {"status": outcome.status, "result": outcome.text}

    async def _ask(self, conversation_id: int, call: dict) -> str:
        """The user's answer for ``call`` (RUN without asking where the chat allows the tool)."""
        if call["name"] in allowed(self.conversations.get(conversation_id).settings):
            return RUN
        answer = await self.approve(conversation_id, call)
        if answer == ALWAYS:
            granted = allowed(self.conversations.get(conversation_id).settings)
            self.conversations.set_setting(conversation_id, ALLOWED, [*granted, call["name"]])
        return answer
