"""What the local and the remote ``generate`` / ``chat`` commands share: the sampling and the chat they build
from the command line, how a streamed reply is printed, and the record of a reply they print with ``--json``."""

from __future__ import annotations

import sys

from ..sampling_params import SamplingParams
from ..serving.prompt_encoder import Chat

DIM, PLAIN = "\x1b[2m", "\x1b[0m"


def params_from(args) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed)


def chat_from(args, messages: list[dict]) -> Chat:
    """The chat the command sends: the system prompt first, and ``--no-think`` as the template's option."""
    system = [{"role": "system", "content": args.system}] if args.system else []
    return Chat(system + messages, {} if args.think else {"enable_thinking": False})


def assistant_message(out) -> dict:
    """A finished reply as the history keeps it: its reasoning with it, for the template to keep or drop."""
    message = {"role": "assistant", "content": out.text}
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    return message


class ReplyPrinter:
    """Prints a streamed reply: its reasoning first (dimmed on a terminal, after "thinking:"), then its answer."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.dim = self.stream.isatty()
        self.thinking = False

    def show(self, out) -> None:
        if out.delta_reasoning:
            if not self.thinking:
                self._write((DIM if self.dim else "") + "thinking: ")
                self.thinking = True
            self._write(out.delta_reasoning)
        if out.delta_text:
            self._end_reasoning()
            self._write(out.delta_text)

    def end(self) -> None:
        self._end_reasoning()
        self._write("\n")

    def _end_reasoning(self) -> None:
        if self.thinking:
            self._write((PLAIN if self.dim else "") + "\n\n")
            self.thinking = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def reply_record(out) -> dict:
    """The ``--json`` line of a finished reply: how it ended and its metrics."""
    return {"finish_reason": out.finish_reason, "error": out.error, **out.metrics.to_dict()}
