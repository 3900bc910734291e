"""``python -m engine generate|chat --remote URL``: the same commands, served by an OpenAI-compatible server.

The reply streams to stdout as it arrives and ends with the same metrics as the local engine's (``--json``: the
same JSON line), measured on this side of the network.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from ..remote import RemoteClient, RemoteConfig, RemoteError
from .reply_args import ReplyPrinter, assistant_message, chat_from, params_from, reply_record

API_KEY_ENV = "KVASIR_API_KEY"
LOCAL_ONLY = {"quant": "auto", "dtype": "auto", "device": "auto", "kv_blocks": None}


def remote_config(args) -> RemoteConfig:
    """The server of ``--remote`` with ``--api-key`` (else $KVASIR_API_KEY); ValueError for a bad address."""
    ignored = [f"--{k.replace('_', '-')}" for k, default in LOCAL_ONLY.items() if getattr(args, k, default) != default]
    if ignored:
        print(f"note: {', '.join(ignored)} apply to the local engine and are ignored with --remote", file=sys.stderr)
    return RemoteConfig(args.remote, api_key=args.api_key or os.environ.get(API_KEY_ENV))


async def pick_model(client: RemoteClient, wanted: str | None) -> str:
    """``wanted``, or the server's only model; raises RemoteError naming the choices otherwise."""
    if wanted:
        return wanted
    names = [m.id for m in await client.models()]
    if len(names) == 1:
        return names[0]
    if not names:
        raise RemoteError(f"{client.config.base_url} serves no model")
    raise RemoteError(f"{client.config.base_url} serves {len(names)} models; pick one with --model: "
                      + ", ".join(names))


async def stream_reply(client: RemoteClient, messages: list[dict], params, model: str):
    """Print a reply as it streams; returns the final output."""
    final, printer = None, ReplyPrinter()
    async for out in client.stream_chat(messages, params, model):
        printer.show(out)
        final = out
    printer.end()
    return final


def remote_generate(args) -> int:
    """One reply to ``args.prompt`` from the server."""
    return asyncio.run(_generate(args, remote_config(args)))


async def _generate(args, config: RemoteConfig) -> int:
    client = RemoteClient(config)
    try:
        model = await pick_model(client, args.model)
        out = await stream_reply(client, chat_from(args, [{"role": "user", "content": args.prompt}]),
                                 params_from(args), model)
    finally:
        await client.aclose()
    if args.json:
        print(json.dumps({**reply_record(out), "model": model, "server": config.base_url}))
    else:
        print(out.metrics.summary(), file=sys.stderr)
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
    return 0 if out.finish_reason != "error" else 1


def remote_chat(args) -> int:
    """A terminal chat with the server's model; the conversation is kept on this side and re-sent each turn."""
    return asyncio.run(_chat(args, remote_config(args)))


async def _chat(args, config: RemoteConfig) -> int:
    client = RemoteClient(config)
    try:
        model = await pick_model(client, args.model)
        print(f"{model} on {config.base_url}. Empty line or Ctrl+D to quit.")
        history: list[dict] = []
        while True:
            text = await asyncio.to_thread(_read_line)
            if not text:
                return 0
            history.append({"role": "user", "content": text})
            print("kvasir> ", end="", flush=True)
            out = await stream_reply(client, chat_from(args, history), params_from(args), model)
            if out.finish_reason == "error":
                print(f"[error: {out.error}]")
                history.pop()  # the turn is not kept: the next message is sent without it
                continue
            history.append(assistant_message(out))
            print(out.metrics.summary())
    finally:
        await client.aclose()


def _read_line() -> str:
    try:
        return input("\nyou> ").strip()
    except (EOFError, KeyboardInterrupt):
        print()
        return ""
