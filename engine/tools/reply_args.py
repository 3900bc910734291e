"""What the local and the remote ``generate`` / ``chat`` commands share: the sampling and the messages they build
from the command line, and the record of a reply they print with ``--json``."""

from __future__ import annotations

from ..sampling_params import SamplingParams


def params_from(args) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed)


def messages_with_system(args, messages: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": args.system}] if args.system else []) + messages


def reply_record(out) -> dict:
    """The ``--json`` line of a finished reply: how it ended and its metrics."""
    return {"finish_reason": out.finish_reason, "error": out.error, **out.metrics.to_dict()}
