"""The OpenAI-compatible app: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``, and
``GET /metrics`` (Prometheus).

Every request goes to the :class:`AsyncEngine` that ``engines()`` returns at that moment, so API requests
batch with the window's chats and share their prefix cache, and a model switch in the window is served at once.
Its ``model`` field picks one of the engine's resident models (a 404 lists them); ``"auto"`` routes by the rules
(:mod:`engine.routing.router`), and the response says where it went and why: its ``model`` field and the
``X-Kvasir-Routed-To`` / ``X-Kvasir-Route-Reason`` headers.
Requests carry the source ``"api"``, which the live panel shows. A client that disconnects aborts its request,
which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HttpRequest
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import EngineDeadError, EngineError, PromptTooLong
from ..routing.router import AUTO, Decision, Request, Router, Routes
from ..serving.async_engine import AsyncEngine, RequestStream, UnknownModel
from ..serving.outputs import RequestOutput
from .config import API_SOURCE, ApiConfig
from .errors import ApiError, bad_field, encode, json_response, shown
from .metrics import prometheus_text
from .model_loader import NoRoom, NotLoadable, OnDemandModels
from .protocol import ApiRequest, parse_chat, parse_completion
from .responses import FINISH_REASONS, Reply, finish_reason, model_card
from .security import AccessGuard

MAX_BODY_BYTES = 8 * 1024**2  # far more than any context holds; tokenising it must not stall the engine
EngineSource = Callable[[], AsyncEngine | None]


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its request has been aborted."""


def create_app(engines: EngineSource | AsyncEngine, config: ApiConfig | None = None,
               routing: Routes | None = None, loader: OnDemandModels | None = None,
               scores: dict[str, dict[str, float]] | None = None) -> Starlette:
    """The ASGI app over ``engines`` (an engine, or a function returning the engine that serves now);
    ``routing``: the rules ``"model": "auto"`` follows (None: :meth:`Routes.default_for` the resident models);
    ``loader``: loads a library model a request names when it is not resident (None: such a request is a 404);
    ``scores``: each model's evaluated accuracy by kind of task, for rules with ``min_score``."""
    config = config or ApiConfig()
    routes = OpenAIRoutes(engines if callable(engines) else lambda: engines, Router(routing, scores), loader)
    return Starlette(
        routes=[
            Route("/v1/models", routes.list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", routes.get_model, methods=["GET"]),
            Route("/v1/chat/completions", routes.chat, methods=["POST"]),
            Route("/v1/completions", routes.complete, methods=["POST"]),
            Route("/metrics", routes.metrics, methods=["GET"]),
        ],
        middleware=[Middleware(AccessGuard, config=config)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, EngineDeadError: _engine_stopped,
                            ClientGone: _client_gone, Exception: _server_error},
    )


class OpenAIRoutes:
    """The endpoints, over whichever engine serves when a request arrives."""

    def __init__(self, engines: EngineSource, router: Router | None = None,
                 loader: OnDemandModels | None = None) -> None:
        self.engines = engines
        self.created = int(time.time())
        self.router = router or Router()
        self.loader = loader

    async def list_models(self, request: HttpRequest) -> Response:
        """The resident models, the primary first; ``auto`` too where several are resident; with on-demand
        loading, the library's other models after them (their ``status`` says they are not loaded)."""
        engine = self._engine()
        ids = engine.model_ids()
        primary = engine.model_id()
        cards = [self._card(i, True) for i in [primary, *(i for i in ids if i != primary)]]
        if len(ids) > 1:
            cards.append(self._card(AUTO, True))
        cards += [self._card(name, False) for name in self._available(engine)]
        return json_response({"object": "list", "data": cards})

    async def get_model(self, request: HttpRequest) -> Response:
        name = request.path_params["model"]
        engine = self._engine()
        if name == AUTO and len(engine.model_ids()) > 1:
            return json_response(self._card(AUTO, True))
        if name in self._available(engine):
            return json_response(self._card(name, False))
        return json_response(self._card(self._resident_id(engine, name), True))

    def _card(self, name: str, loaded: bool) -> dict:
        """A model's entry; with on-demand loading it says whether the model is loaded (as llama-server's router
        does)."""
        card = model_card(name, self.created)
        if self.loader is not None:
            card["status"] = {"value": "loaded" if loaded else "unloaded"}
        return card

    def _available(self, engine: AsyncEngine) -> list[str]:
        return self.loader.available(engine.model_ids()) if self.loader is not None else []

    async def metrics(self, request: HttpRequest) -> Response:
        """The engine's KV usage, queues and prefix-cache counters, for Prometheus and remote panels."""
        engine = self._engine()
        models = {i: engine.stats(i) for i in engine.model_ids()}
        return PlainTextResponse(prometheus_text(models if len(models) > 1 else engine.stats()),
                                 media_type="text/plain; version=0.0.4")

    async def chat(self, request: HttpRequest) -> Response:
        return await self._generate(request, parse_chat(await read_json(request)))

    async def complete(self, request: HttpRequest) -> Response:
        return await self._generate(request, parse_completion(await read_json(request)))

    def _engine(self) -> AsyncEngine:
        """The serving engine (a 503 while none serves)."""
        engine = self.engines()
        if engine is None:
            raise ApiError(503, "no model is loaded yet; try again once it has loaded", code="model_not_loaded")
        if not engine.alive:
            raise engine_stopped(EngineDeadError(engine.failure))
        return engine

    def _resident_id(self, engine: AsyncEngine, model: str) -> str:
        """The id of the resident model ``model`` names; a 404 listing the models where none does."""
        try:
            return engine.model_id(model)
        except UnknownModel as exc:
            served = ", ".join(repr(i) for i in [*exc.resident, *self._available(engine)])
            raise ApiError(404, f"The model {shown(model, 80)} does not exist; this server serves {served} "
                                "(see GET /v1/models)", param="model", code="model_not_found") from None

    async def _model_id(self, engine: AsyncEngine, model: str) -> str:
        """The id of the model ``model`` names, loaded first where it is a library model that is not resident
        (with on-demand loading); a 404 listing the models where there is none, a 503 where it cannot load."""
        try:
            return engine.model_id(model)
        except UnknownModel:
            if self.loader is None:
                return self._resident_id(engine, model)
        try:
            return await self.loader.load(engine, model)
        except NotLoadable:
            return self._resident_id(engine, model)
        except NoRoom as exc:
            raise ApiError(503, str(exc), code="insufficient_memory") from None
        except (EngineError, OSError, ValueError) as exc:
            raise ApiError(503, f"The model {shown(model, 80)} could not be loaded: {exc}",
                           code="model_load_failed") from None

    def _route(self, engine: AsyncEngine, api: ApiRequest) -> Decision:
        """Where a request for ``auto`` goes (see :mod:`engine.routing.router`)."""
        return self.router.route_on(engine, Request.of(api.prompt))

    async def _generate(self, request: HttpRequest, api: ApiRequest) -> Response:
        """Start the ``n`` requests and wait for their first outputs before answering, so that a request the
        engine refuses still gets its status code; then stream, or wait for the whole replies."""
        engine = self._engine()
        decision = self._route(engine, api) if api.model == AUTO else None
        model = decision.model if decision else await self._model_id(engine, api.model)
        headers = route_headers(decision)
        streams = await _start(engine, api, model)
        reply = Reply(api.kind, model)
        try:
            firsts = await until_disconnected(request, asyncio.gather(*(anext(s) for s in streams)))
            _raise_if_failed(firsts)
            if api.stream:
                return EventStream(events(reply, firsts, streams, api.include_usage), streams, headers)
            work = asyncio.gather(*(_last(first, s) for first, s in zip(firsts, streams)))
            finals = await until_disconnected(request, work)
            _raise_if_failed(finals)
        except BaseException:
            _abort(streams)  # the replies still running when another failed, or the client went away
            raise
        return json_response(reply.full(finals), headers=headers)


def route_headers(decision: Decision | None) -> dict[str, str]:
    """Where ``auto`` sent the request and why (ASCII only: header values are Latin-1)."""
    if decision is None:
        return {}
    return {"X-Kvasir-Routed-To": decision.model,
            "X-Kvasir-Route-Reason": decision.reason.encode("ascii", "replace").decode()}


async def _start(engine: AsyncEngine, api: ApiRequest, model: str) -> list[RequestStream]:
    """Tokenise the prompt (off the engine thread), size ``max_tokens`` to the context, start the ``n`` requests
    (the same prompt: they run in one batch) on ``model``."""
    try:
        ids = await engine.encode(api.prompt, model)
    except PromptTooLong as exc:
        raise bad_field(api.prompt_field, str(exc), code="context_length_exceeded") from None
    except ValueError as exc:
        raise bad_field(api.prompt_field, str(exc)) from None
    max_tokens = _max_tokens(engine.stats(model), api, len(ids))
    forced = api.tool_choice
    structure = engine.forced_call(api.prompt.tools, forced.name, model) if forced.forced else None
    params = [api.sampling_params(max_tokens, i, structure) for i in range(api.n)]
    try:
        await engine.check_structure(params[0], model)
    except ValueError as exc:
        raise bad_field(api.structure_field, str(exc)) from None
    return [engine.stream(ids, p, source=API_SOURCE, model=model) for p in params]


def _raise_if_failed(outputs: list[RequestOutput]) -> None:
    for out in outputs:
        if out.finished and out.finish_reason not in FINISH_REASONS:
            raise failure(out)


def _abort(streams: list[RequestStream]) -> None:
    for stream in streams:
        stream.abort()


def _max_tokens(stats, api: ApiRequest, prompt_tokens: int) -> int:
    """The request's ``max_tokens`` if prompt and reply fit the context (``stats``: the model's), else a 400
    saying by how much; when not given, what OpenAI's servers default to (the context left for chat, 16 for
    completions)."""
    limit = min(stats.max_model_len, stats.kv_blocks_total * stats.block_size)
    where = "messages" if api.kind == "chat" else "prompt"
    if prompt_tokens == 0:
        raise bad_field(api.prompt_field, f"the {where} are empty once tokenised" if api.kind == "chat"
                        else "the prompt is empty")
    if prompt_tokens >= limit:
        raise bad_field(api.prompt_field,
                        f"This model's maximum context length is {limit} tokens, but the {where} alone take "
                        f"{prompt_tokens} tokens, leaving no room for a reply. Please shorten the {where}.",
                        code="context_length_exceeded")
    room = limit - prompt_tokens
    if api.max_tokens is None:
        return room if api.kind == "chat" else min(room, 16)
    if api.max_tokens > room:
        raise bad_field(api.max_tokens_field,
                        f"This model's maximum context length is {limit} tokens. However, you requested "
                        f"{prompt_tokens + api.max_tokens} tokens ({prompt_tokens} in the {where}, {api.max_tokens} "
                        f"in the completion). Please reduce the length of the {where} or the completion.",
                        code="context_length_exceeded")
    return api.max_tokens


async def read_json(request: HttpRequest) -> dict:
    """The body as a JSON object; a 413 past ``MAX_BODY_BYTES``, a 400 for anything that is not an object."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES // 1024**2} MiB")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise ApiError(400, "We could not parse the JSON body of your request. (HINT: This likely means you "
                            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)",
                       code="invalid_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the request body must be a JSON object, not a JSON {type(value).__name__}",
                       code="invalid_json")
    return value


async def until_disconnected(request: HttpRequest, work):
    """The result of ``work``, or :class:`ClientGone` (with ``work`` cancelled) if the client goes first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()  # cancelling a stream's wait aborts its request
    if task.done() and not task.cancelled():
        return task.result()
    raise ClientGone


async def _disconnect(request: HttpRequest) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _last(first: RequestOutput, stream: RequestStream) -> RequestOutput:
    out = first
    while not out.finished:
        out = await anext(stream)
    return out


async def events(reply: Reply, firsts: list[RequestOutput], streams: list[RequestStream],
                 include_usage: bool) -> AsyncIterator[str]:
    """The server-sent events of streamed replies, ending with ``data: [DONE]``; a failure mid-way is sent as
    an error event (OpenAI's clients raise it), what had arrived stays with the client."""
    finals: list[RequestOutput | None] = [None] * len(streams)
    try:
        if reply.kind == "chat":
            for index in range(len(streams)):
                yield sse(reply.chunk(index, "", first=True, with_usage=include_usage))
        async with contextlib.aclosing(merged(firsts, streams)) as outputs:
            async for index, out in outputs:
                if out.finished and out.finish_reason not in FINISH_REASONS:
                    yield sse(failure(out).body())
                    break
                if out.delta_reasoning:
                    yield sse(reply.chunk(index, "", reasoning=out.delta_reasoning, with_usage=include_usage))
                if out.delta_text:
                    yield sse(reply.chunk(index, out.delta_text, with_usage=include_usage))
                if out.delta_tool_calls:
                    first = len(out.tool_calls) - len(out.delta_tool_calls)
                    calls = [c.as_openai(first + i) for i, c in enumerate(out.delta_tool_calls)]
                    yield sse(reply.chunk(index, "", calls=calls, with_usage=include_usage))
                if out.finished:
                    finals[index] = out
                    yield sse(reply.chunk(index, "", finish_reason(out), with_usage=include_usage))
            else:
                if include_usage:
                    yield sse(reply.usage_chunk(finals))
    except EngineDeadError as exc:
        yield sse(engine_stopped(exc).body())
    finally:
        _abort(streams)  # no-op once finished
    yield "data: [DONE]\n\n"


async def merged(firsts: list[RequestOutput], streams: list[RequestStream]):
    """(reply index, output) of several streams as each output arrives, until all have finished."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, out: RequestOutput, stream: RequestStream) -> None:
        try:
            await queue.put((index, out))
            while not out.finished:
                out = await anext(stream)
                await queue.put((index, out))
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put((index, exc))

    pumps = [asyncio.ensure_future(pump(i, first, s)) for i, (first, s) in enumerate(zip(firsts, streams))]
    try:
        live = len(streams)
        while live:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                live -= 1
            yield index, item
    finally:
        for task in pumps:
            task.cancel()  # cancelling a stream's wait aborts its request


class EventStream(StreamingResponse):
    """``text/event-stream`` that aborts its requests however the response ends (a client that disconnects
    cancels the sending task; Starlette watches for it)."""

    def __init__(self, content: AsyncIterator[str], streams: list[RequestStream],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self.streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            _abort(self.streams)


def sse(body: dict) -> str:
    return f"data: {encode(body)}\n\n"


def failure(out: RequestOutput) -> ApiError:
    """A request the engine ended without finishing: the model was switched (503) or it failed (500)."""
    if out.finish_reason == "abort":
        # Without a reason it was the engine shutting down (this server's own aborts are never read).
        return ApiError(503, out.error or "the engine is shutting down; the reply was stopped",
                        code="request_aborted")
    return ApiError(500, out.error or "the engine failed on this request", code="engine_error")


async def _api_error(request: HttpRequest, exc: ApiError) -> Response:
    return exc.response()


async def _http_error(request: HttpRequest, exc: HTTPException) -> Response:
    """Starlette's own 404 (no such path) and 405 (wrong method), in OpenAI's shape."""
    message = {404: f"no such endpoint: {request.method} {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
    return ApiError(exc.status_code, message, headers=dict(exc.headers or {})).response()


def engine_stopped(exc: EngineDeadError) -> ApiError:
    return ApiError(503, f"the engine has stopped: {exc}", code="engine_stopped")


async def _engine_stopped(request: HttpRequest, exc: EngineDeadError) -> Response:
    return engine_stopped(exc).response()


async def _client_gone(request: HttpRequest, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nobody reads it; the request was aborted


async def _server_error(request: HttpRequest, exc: Exception) -> Response:
    return ApiError(500, f"the server failed on this request: {type(exc).__name__}: {exc}",
                    code="server_error").response()
