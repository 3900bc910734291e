"""A client for OpenAI-compatible servers: the models they serve and streamed chat replies.

A reply streams as the engine's own :class:`RequestOutput`s, so whatever shows a local reply shows a remote
one the same way. Its metrics are measured here, on the client: TTFT from sending the request to the first
piece of text, tokens/s between the first and the last piece; token counts come from the server's ``usage``
(asked for with ``stream_options.include_usage``) where it reports them, ``None`` where it does not.

Every failure ends the reply with ``finish_reason="error"`` and a reason in words, keeping the text that had
arrived. Only a connection that could not be opened is tried again (nothing reached the server); a reply that
has started is never sent again. Leaving the ``async for`` early closes the connection, which is how a server
is told to stop.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import httpx

from ..sampling_params import SamplingParams
from ..serving.metrics import RequestMetrics
from ..serving.outputs import RequestOutput
from ..serving.prompt_encoder import Chat
from .errors import RemoteError, error_message, status_reason, transport_reason
from .metrics import ServerMetrics, read_server_metrics
from .server_url import RemoteConfig
from .sse import DONE, LineSplitter, SSEDecoder
from .tool_call_deltas import ToolCallDeltas

METRICS_TIMEOUT_S = 5.0  # a scrape that takes longer is not worth waiting for: the panel asks again
RETRY_BACKOFF_S = 0.25  # doubled after each failed connection attempt
RETRY_STATUSES = {502, 503, 504}  # a GET of the model list may be repeated when a proxy or a starting server says so
SAMPLING_DEFAULTS = SamplingParams()
FINISH_REASONS = {"stop": "stop", "length": "length"}  # others (tool_calls, content_filter, eos) end as "stop"
ToolChoice = str | dict | None  # OpenAI's tool_choice: "auto", "required", {"type": "function", ...}; None: not sent


@dataclass(frozen=True, slots=True)
class RemoteModel:
    """One entry of ``/v1/models``: its id and, where the server says (vLLM's ``max_model_len``, llama-server's
    ``meta.n_ctx``), its context length."""

    id: str
    owned_by: str | None = None
    max_model_len: int | None = None


@dataclass(slots=True)
class _Reply:
    """What has arrived of one streamed reply, and when."""

    started: float
    text: str = ""
    reasoning: str = ""
    pieces: int = 0
    first: float | None = None
    last: float | None = None
    finish_reason: str | None = None
    usage: dict = field(default_factory=dict)
    calls: ToolCallDeltas = field(default_factory=ToolCallDeltas)


class RemoteClient:
    """One server: ``await models()``, ``stream_chat(...)``, ``await server_metrics()``; ``await aclose()`` at the
    end. Use it on one asyncio loop (the connection pool belongs to the loop that first used it)."""

    def __init__(self, config: RemoteConfig) -> None:
        self.config = config
        headers = {"Accept": "application/json"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        timeout = httpx.Timeout(connect=config.connect_timeout_s, read=config.read_timeout_s,
                                write=config.read_timeout_s, pool=config.connect_timeout_s)
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout, follow_redirects=False, trust_env=False)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def models(self) -> list[RemoteModel]:
        """The models the server serves; raises :class:`RemoteError` saying why when it can't be asked."""
        response = await self._get(self.config.api_root + "/models")
        try:
            entries = response.json().get("data")
        except (ValueError, AttributeError):
            entries = None
        if not isinstance(entries, list):
            raise RemoteError(f"{self.config.api_root}/models did not answer with a model list; "
                              "is this an OpenAI-compatible server?")
        return [_model(e) for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]

    async def server_metrics(self) -> ServerMetrics:
        """The server's KV usage and prefix hit rate from its Prometheus ``/metrics``; an empty
        :class:`ServerMetrics` (nothing reported) when it has none. Raises :class:`RemoteError` only when the
        server can't be reached at all."""
        try:
            response = await self._http.get(self.config.metrics_url, headers={"Accept": "text/plain"},
                                            timeout=min(METRICS_TIMEOUT_S, self.config.read_timeout_s))
        except httpx.HTTPError as exc:
            raise RemoteError(transport_reason(exc, self.config.base_url, self.config.read_timeout_s)) from exc
        if response.status_code != 200:
            return ServerMetrics.not_reported(f"/metrics answered HTTP {response.status_code}")
        return read_server_metrics(response.text)

    def stream_chat(self, messages: list[dict] | Chat, sampling: SamplingParams, model: str,
                    request_id: str | None = None, tool_choice: ToolChoice = None) -> RemoteStream:
        """Stream a reply to chat ``messages`` (or a :class:`Chat` with template options and tools) from
        ``model``, its calls held to ``tool_choice`` where given; ``async for`` its outputs."""
        return RemoteStream(self, messages, sampling, model, request_id, tool_choice)

    # -- requests -------------------------------------------------------------------------------------

    async def _get(self, url: str) -> httpx.Response:
        """GET with retries where that is safe: a connection not opened, or a gateway saying "try again"."""
        delay = RETRY_BACKOFF_S
        for attempt in range(self.config.connect_retries + 1):
            last = attempt == self.config.connect_retries
            try:
                response = await self._http.get(url)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if last:
                    raise RemoteError(transport_reason(exc, self.config.base_url, self.config.read_timeout_s)) \
                        from exc
            except httpx.HTTPError as exc:
                raise RemoteError(transport_reason(exc, self.config.base_url, self.config.read_timeout_s)) from exc
            else:
                if response.status_code == 200:
                    return response
                if response.status_code not in RETRY_STATUSES or last:
                    raise RemoteError(status_reason(response.status_code, response.content, response.headers))
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def _open_stream(self, body: dict) -> httpx.Response:
        """POST a streamed completion; a connection that could not be opened is tried again (nothing was sent)."""
        request = self._http.build_request("POST", self.config.api_root + "/chat/completions", json=body,
                                           headers={"Accept": "text/event-stream"})
        delay = RETRY_BACKOFF_S
        for attempt in range(self.config.connect_retries + 1):
            try:
                return await self._http.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if attempt == self.config.connect_retries:
                    raise
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


class RemoteStream:
    """One streamed reply: ``request_id`` at once, then ``async for out in stream``. Leaving the loop (or
    cancelling the task) closes the connection."""

    def __init__(self, client: RemoteClient, messages: list[dict] | Chat, sampling: SamplingParams, model: str,
                 request_id: str | None = None, tool_choice: ToolChoice = None) -> None:
        self.request_id = request_id or new_request_id()
        self.client, self.model = client, model
        chat = messages if isinstance(messages, Chat) else Chat(list(messages))
        messages = chat.messages
        self.body = request_body(messages, sampling, model, chat.options, chat.tools, tool_choice)
        last = messages[-1] if messages else {}
        self.continued = (last.get("content") or "") if last.get("role") == "assistant" else ""

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._run()

    async def _run(self) -> AsyncIterator[RequestOutput]:
        reply = _Reply(started=time.perf_counter())
        config = self.client.config
        try:
            response = await self.client._open_stream(self.body)
        except httpx.HTTPError as exc:
            yield self._output(reply, "", transport_reason(exc, config.base_url, config.read_timeout_s))
            return
        try:
            if response.status_code != 200:
                body = await response.aread()
                yield self._output(reply, "", status_reason(response.status_code, body, response.headers))
                return
            async with aclosing(self._deltas(response, reply)) as deltas:  # closed here, in this task
                async for delta, reasoning in deltas:
                    yield self._output(reply, delta, reasoning=reasoning)
            yield self._output(reply, "", self._ending_problem(reply))
        except httpx.HTTPError as exc:
            yield self._output(reply, "", _keep_finished(reply, transport_reason(exc, config.base_url,
                                                                                   config.read_timeout_s)))
        except RemoteError as exc:
            yield self._output(reply, "", str(exc))
        finally:
            await response.aclose()

    async def _deltas(self, response: httpx.Response, reply: _Reply) -> AsyncIterator[tuple[str, str]]:
        """The reply's new (text, reasoning), piece by piece and timed; an echo of the message being continued is
        dropped."""
        echo = EchoFilter(self.continued)
        async with aclosing(self._pieces(response, reply)) as pieces:
            async for piece, reasoning in pieces:
                now = time.perf_counter()
                reply.first = reply.first or now
                reply.last, reply.pieces = now, reply.pieces + 1
                delta = echo.feed(piece) if piece else ""
                reply.text += delta
                reply.reasoning += reasoning
                if delta or reasoning:
                    yield delta, reasoning
        tail = echo.flush()
        if tail:
            reply.text += tail
            yield tail, ""

    async def _pieces(self, response: httpx.Response, reply: _Reply) -> AsyncIterator[tuple[str, str]]:
        """The (text, reasoning) of each event of the stream that carries any (a piece of a tool call counts,
        with neither), recording finish reason, usage and tool calls on ``reply``."""
        decoder = SSEDecoder()
        async with aclosing(_lines(response)) as lines:
            async for line in lines:
                event = decoder.feed(line)
                if event is None:
                    continue
                if event.data.strip() == DONE:
                    return
                piece = _apply_chunk(reply, _chunk(event.data, event.event))
                if piece is not None:
                    yield piece
        event = decoder.flush()
        if event is not None and event.data.strip() != DONE:
            piece = _apply_chunk(reply, _chunk(event.data, event.event))
            if piece is not None:
                yield piece

    @staticmethod
    def _ending_problem(reply: _Reply) -> str | None:
        """None when the stream ended as a finished reply; else why the reply is incomplete."""
        if reply.finish_reason is None:
            return "the server ended the stream before the reply finished (no finish reason)"
        return None

    def _output(self, reply: _Reply, delta: str, error: str | None = None, reasoning: str = "") -> RequestOutput:
        finished = error is not None or (not delta and not reasoning and reply.finish_reason is not None)
        calls: tuple = ()
        if finished and error is None and reply.calls:
            try:  # a finished reply's calls, which arrive whole only at its end
                calls = reply.calls.calls()
            except RemoteError as exc:
                error = str(exc)
        reason = "error" if error is not None else (reply.finish_reason if finished else None)
        return RequestOutput(self.request_id, reply.text, [], delta, [], finished, reason, error, _metrics(reply),
                             reasoning=reply.reasoning, delta_reasoning=reasoning, tool_calls=calls,
                             delta_tool_calls=calls)


class EchoFilter:
    """Drops the start of a reply that repeats ``prefix``: a chat ending with the assistant's message asks the
    server to continue it, and llama-server streams that message back before the new words; a server that
    does not echo it loses nothing. Text that stops matching is let through whole; nothing else is held back."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.pending, self.done = prefix, "", not prefix

    def feed(self, text: str) -> str:
        """The part of ``text`` that is new."""
        if self.done:
            return text
        self.pending += text
        if len(self.pending) < len(self.prefix) and self.prefix.startswith(self.pending):
            return ""  # so far it could still be the echo
        self.done = True
        held, self.pending = self.pending, ""
        return held[len(self.prefix):] if held.startswith(self.prefix) else held

    def flush(self) -> str:
        """What was held back when the reply ended before the echo could be told apart."""
        held, self.pending, self.done = self.pending, "", True
        return held


def new_request_id() -> str:
    """An id for a remote reply, told apart from the local engine's."""
    return f"remote-{uuid.uuid4().hex[:12]}"


_END = object()


async def _lines(response: httpx.Response) -> AsyncIterator[str]:
    """The response's lines, read by a task of their own. httpx reads through nested async generators; stopping
    early (at ``[DONE]``, on a bad event, on close) cancels that task, which ends each of them properly. Left
    suspended instead, they would be finalised later outside any task, and loops without asyncio's generator
    hooks (qasync's) report errors for them."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=256)

    async def read() -> None:
        splitter = LineSplitter()  # httpx's own line reader holds a line of any length
        try:
            async for text in response.aiter_text():
                for line in splitter.feed(text):
                    await queue.put(line)
            for line in splitter.flush():
                await queue.put(line)
        except Exception as exc:  # handed to the reader below, which must never wait for a line that won't come
            await queue.put(exc)
        else:
            await queue.put(_END)

    reader = asyncio.ensure_future(read())
    try:
        while (item := await queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


def request_body(messages: list[dict], sampling: SamplingParams, model: str, options: dict | None = None,
                 tools: list[dict] | None = None, tool_choice: ToolChoice = None) -> dict:
    """The ``/v1/chat/completions`` body: the usual OpenAI fields (``tools`` and ``tool_choice`` where there
    are tools), and the extensions vLLM, SGLang and llama-server accept (top_k, min_p, repetition_penalty, ...,
    continuing the final message, the chat template's ``options`` as chat_template_kwargs) only where they are
    needed, so a strict server is not sent fields it refuses."""
    body = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p}
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    for name in ("top_k", "min_p", "repetition_penalty", "ignore_eos"):
        if getattr(sampling, name) != getattr(SAMPLING_DEFAULTS, name):
            body[name] = getattr(sampling, name)
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if options:
        body["chat_template_kwargs"] = dict(options)
    if tools:
        body["tools"] = list(tools)
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
    if messages and messages[-1].get("role") == "assistant":
        # continue that message rather than start another: vLLM's fields, which SGLang and llama-server read too
        body["continue_final_message"], body["add_generation_prompt"] = True, False
    return body


def _chunk(data: str, event: str) -> dict:
    """One event's JSON; a malformed event or an error event raises :class:`RemoteError`."""
    try:
        chunk = json.loads(data)
    except ValueError:
        shown = data if len(data) <= 80 else data[:79] + "…"
        raise RemoteError(f"the server sent a malformed event (not JSON): {shown!r}") from None
    if not isinstance(chunk, dict):
        raise RemoteError(f"the server sent a malformed event (a JSON {type(chunk).__name__}, not an object)")
    message = error_message(chunk) if ("error" in chunk or event == "error") else None
    if message or event == "error":
        raise RemoteError(f"the server stopped the reply with an error: {message or data}")
    return chunk


def _apply_chunk(reply: _Reply, chunk: dict) -> tuple[str, str] | None:
    """Record a chunk's finish reason, usage and pieces of tool calls on ``reply``; return its new text and
    reasoning (vLLM's and llama-server's ``reasoning_content``, or ``reasoning`` as some servers call it), None
    where it has neither nor a piece of a call."""
    if isinstance(chunk.get("usage"), dict):
        reply.usage = chunk["usage"]
    text = reasoning = ""
    called = False
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if isinstance(delta.get("content"), str):
            text += delta["content"]
        thought = delta.get("reasoning_content", delta.get("reasoning"))
        if isinstance(thought, str):
            reasoning += thought
        if delta.get("tool_calls") is not None:
            reply.calls.add(delta["tool_calls"])
            called = True
        if choice.get("finish_reason"):
            reply.finish_reason = FINISH_REASONS.get(choice["finish_reason"], "stop")
    return (text, reasoning) if text or reasoning or called else None


def _keep_finished(reply: _Reply, reason: str) -> str | None:
    """A connection lost after the reply's finish reason arrived (while waiting for usage or [DONE]) loses
    nothing: the reply is complete."""
    return None if reply.finish_reason is not None else reason


def _metrics(reply: _Reply) -> RequestMetrics:
    usage = reply.usage
    output = _count(usage.get("completion_tokens"))
    output = reply.pieces if output is None else output
    rate = None
    if output > 1 and reply.first is not None and reply.last is not None and reply.last > reply.first:
        rate = (output - 1) / (reply.last - reply.first)
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    ttft = None if reply.first is None else reply.first - reply.started
    # queue time: the server's own, which the client can't see; the TTFT includes it
    return RequestMetrics(None, ttft, _count(usage.get("prompt_tokens")), cached, output, rate)


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _model(entry: dict) -> RemoteModel:
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    length = _count(entry.get("max_model_len"))  # vLLM; llama-server says n_ctx in its "meta"
    length = length if length is not None else _count(meta.get("n_ctx"))
    owner = entry.get("owned_by")
    return RemoteModel(entry["id"], owner if isinstance(owner, str) else None, length)
