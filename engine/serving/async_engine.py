"""An engine that runs in its own thread and streams to asyncio code.

One background thread owns the model and every torch call. Other threads talk to it through a command
queue; outputs travel back to each caller's event loop with ``call_soon_threadsafe``. Prompts are templated and
tokenised before they reach that thread, on a small pool of its own (:class:`PromptEncoder`), so a huge or hostile
prompt never holds up the streams already running.

Several models can be resident at once (:mod:`.resident`): each request names its model (or goes to the
primary, the one the window serves), a model loads on a thread of its own and joins between two steps, so
loading one never stops the replies of another, and the engine thread steps every model with work in turn.

The thread survives any failure of a step (the engine ends the requests it touched and carries on). If it
dies anyway, every open stream ends at once with :class:`EngineDeadError`, later calls raise it, and
``on_failure`` tells the owner why, so nothing waits for ever.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..config import EngineConfig
from ..errors import EngineDeadError
from ..sampling_params import SamplingParams, Structure
from .engine import UNLOADED_MESSAGE, Engine, describe_failure
from .metrics import EngineStats
from .outputs import RequestOutput
from .prompt_encoder import Prompt, is_token_id
from .resident import ResidentModels, model_id

log = logging.getLogger(__name__)
STATS_INTERVAL_S = 0.05
SHUTDOWN_MESSAGE = "the engine has shut down"
ENCODER_THREADS = 2
SHUTDOWN_TIMEOUT_S = 5.0  # the step under way finishes first; past this the thread (a daemon) is left to end


class UnknownModel(LookupError):
    """A request named a model that is not resident; the message lists those that are."""

    def __init__(self, name: str, resident: list[str]) -> None:
        super().__init__(f"the model {name!r} is not loaded; loaded: {', '.join(resident) or 'none'}")
        self.name, self.resident = name, resident


class RequestStream:
    """Async iterator over one request's outputs. Leaving it early, cancelling, or dropping it aborts the
    request (the engine holds streams weakly, so an abandoned stream does not generate to ``max_tokens``)."""

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:
            self.abort()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item

    def abort(self) -> None:
        """Stop the request (no-op once it has finished)."""
        if not self._done:
            self._done = True
            self._engine.abort(self.request_id)

    async def aclose(self) -> None:
        self.abort()

    def __del__(self) -> None:
        if not self._done:
            self._engine.abort(self.request_id)

    def _deliver(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)


class AsyncEngine:
    """The engine in a background thread; see docs/architecture.md. Construction loads the model and may raise.

    ``on_failure(reason)`` is called once, from the engine thread, if the thread dies.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        progress=None,
        engine_factory: Callable[[], Engine] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ):
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, weakref.ref[RequestStream]]] = {}
        self._lock = threading.Lock()  # guards _streams, _preparing and failure against a dying thread
        self._preparing: set[str] = set()  # requests whose prompts are being encoded
        self._encoder = ThreadPoolExecutor(ENCODER_THREADS, thread_name_prefix="kvasir-prompts")
        self._ids = itertools.count()
        self._stats: EngineStats | None = None  # the primary model's
        self._model_stats: dict[str, EngineStats] = {}  # every resident model's, by id
        self._stopping = False
        self._models = ResidentModels()
        self.idle_unload_s: float | None = None  # models other than the primary unused this long are unloaded
        self._on_failure = on_failure
        self.failure: str | None = None  # why the engine thread stopped; None while it serves
        factory = engine_factory or (lambda: Engine(config, progress))
        loaded: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(factory, loaded), name="kvasir-engine", daemon=True)
        self._thread.start()
        loaded.result()

    # -- public API ---------------------------------------------------------------------------------

    @property
    def _engine(self) -> Engine | None:
        """The primary model's engine: what the window serves, and where a request naming no model goes."""
        return self._models.primary

    @property
    def alive(self) -> bool:
        """True while the engine thread serves requests."""
        return self.failure is None and self._thread.is_alive()

    def stream(self, prompt: Prompt, sampling: SamplingParams | None = None, *, source: str = "",
               model: str | None = None) -> RequestStream:
        """Start a request; iterate the result with ``async for`` to receive its outputs. ``source`` labels
        who sent it (see :meth:`Engine.add_request`); ``model``: the resident model to run it on (its id or
        another name it answers to, see :mod:`.resident`), None for the primary.

        Raises :class:`EngineDeadError` when the engine thread has stopped, :class:`UnknownModel` when no resident
        model answers to ``model``.
        """
        loop = asyncio.get_running_loop()
        engine = self._resolve(model)
        request_id = f"areq-{next(self._ids)}"
        stream = RequestStream(self, request_id)
        # token ids go straight in, in the order they came; a structure's grammar is compiled off the engine thread
        ready = _is_token_ids(prompt) and (sampling is None or sampling.structure is None)
        with self._lock:
            self._raise_if_dead()
            self._streams[request_id] = (loop, weakref.ref(stream))
            if ready:
                self._commands.put(("add", (request_id, prompt, prompt, sampling, source, None, engine, None)))
            else:
                self._preparing.add(request_id)
        if not ready:
            self._encoder.submit(self._prepare, request_id, prompt, sampling, source, engine)
        return stream

    def model_ids(self) -> list[str]:
        """The resident models' ids, in the order they were loaded."""
        return self._models.ids()

    def model_id(self, model: str | None = None) -> str:
        """The id of the resident model ``model`` names (None: the primary); :class:`UnknownModel` if none."""
        return model_id(self._resolve(model))

    def _resolve(self, model: str | None) -> Engine:
        self._raise_if_dead()
        engine = self._models.find(model)
        if engine is None or not engine.has_model:
            raise UnknownModel(model or "", self._models.ids())
        return engine

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread."""
        with self._lock:
            if request_id in self._preparing:  # its prompt is still being encoded: it never starts
                self._preparing.discard(request_id)
                self._streams.pop(request_id, None)
                return
        self._commands.put(("abort", request_id))

    def encode_prompt(self, prompt: Prompt, model: str | None = None) -> list[int]:
        """Token ids of ``prompt`` for the model ``model`` names (None: the primary; see
        :meth:`Engine.encode_prompt`). Blocks while the template renders: call it from a worker thread, or await
        :meth:`encode`."""
        engine = self._resolve(model) if model is not None else self._engine
        self._raise_if_dead()
        encoder = getattr(engine, "prompts", None)
        if encoder is None:  # between two models: the engine thread answers once the next one is in
            return self.call(lambda engine: engine.encode_prompt(prompt), model).result()
        return encoder.encode(prompt)

    def forced_call(self, tools: list[dict], name: str | None, model: str | None = None) -> Structure:
        """The form of a reply that must call ``name`` (None: any of ``tools``), in the tool-call format of the
        model ``model`` names."""
        return self._resolve(model).forced_call(tools, name)

    async def check_structure(self, sampling: SamplingParams, model: str | None = None) -> None:
        """Raise ``GrammarError`` (a ``ValueError``) naming what the model ``model`` names cannot enforce of
        ``sampling``'s structure; compiled off the engine thread."""
        engine = self._resolve(model)
        await asyncio.get_running_loop().run_in_executor(self._encoder, engine.constraint_for, sampling)

    async def encode(self, prompt: Prompt, model: str | None = None) -> list[int]:
        """:meth:`encode_prompt` on the encoder pool, neither on the event loop nor the engine thread."""
        return await asyncio.wrap_future(self._encoder.submit(self.encode_prompt, prompt, model))

    def call(self, fn: Callable[[Engine], Any], model: str | None = None) -> Future:
        """Run ``fn(engine)`` on the engine thread between steps, with the engine of the model ``model`` names
        (None: the primary); returns a concurrent Future."""
        future: Future = Future()
        with self._lock:
            if self.failure is not None:
                future.set_exception(EngineDeadError(self.failure))
            else:
                self._commands.put(("call", (fn, future, model)))
        return future

    async def run(self, fn: Callable[[Engine], Any], model: str | None = None) -> Any:
        """Awaitable form of :meth:`call`."""
        return await asyncio.wrap_future(self.call(fn, model))

    async def load_model(self, config: EngineConfig, progress=None) -> str:
        """Load ``config``'s model beside the resident ones and return its id. The load runs on a thread of its
        own (the models already resident go on writing their replies) and the engine joins between two steps.
        Raises what the load raises (a model that does not fit beside the others is refused, in words), or
        ``ValueError`` where the same model is resident already."""
        self._raise_if_dead()
        engine = await asyncio.to_thread(Engine, config, progress)
        try:
            return await self.run(lambda _: self._adopt(engine))
        except BaseException:
            engine.unload(UNLOADED_MESSAGE)
            raise

    async def unload_model(self, model: str) -> None:
        """Unload the resident model ``model`` names: its running replies end with an error saying so, and its
        weights and KV pool go back to the system. The last resident model stays (switch it instead)."""
        await self.run(lambda _: self._unload(self._resolve(model)))

    async def switch_model(self, config: EngineConfig, progress=None, model: str | None = None) -> None:
        """Switch the resident model ``model`` names (None: the primary) to ``config`` on the engine thread (see
        :meth:`Engine.switch_model`); raises if it fails."""

        def switch(engine: Engine) -> None:
            old_id = model_id(engine)
            try:
                engine.switch_model(config, progress)
            finally:
                if engine.has_model:
                    self._dispatch(engine.step())  # deliver the aborts of interrupted requests
                    self._model_stats.pop(old_id, None)
                    self._refresh_stats(engine)

        await self.run(switch, model)

    def least_recently_used(self) -> list[str]:
        """The resident models' ids, the one no request has gone to for longest first (unloaded first for room)."""
        return [model_id(engine) for engine in self._models if engine.has_model]

    def stats(self, model: str | None = None) -> EngineStats:
        """The latest snapshot of the model ``model`` names (None: the primary), refreshed by the engine thread;
        safe from any thread."""
        if model is None:
            return self._stats
        snapshot = self._model_stats.get(model)  # by id: also while the model is being switched
        return snapshot or self._model_stats.get(self.model_id(model)) or self._stats

    def all_stats(self) -> dict[str, EngineStats]:
        """Every resident model's latest snapshot, by id."""
        return dict(self._model_stats)

    @property
    def tokenizer(self):
        return self._engine.tokenizer

    def shutdown(self) -> None:
        """Abort everything and stop the thread."""
        self._encoder.shutdown(wait=False, cancel_futures=True)
        if self._thread.is_alive():
            self._stopping = True
            self._commands.put(("stop", None))
            self._thread.join(timeout=SHUTDOWN_TIMEOUT_S)
        self._end_streams(SHUTDOWN_MESSAGE)

    # -- the encoder pool ---------------------------------------------------------------------------

    def _prepare(self, request_id: str, prompt: Prompt, sampling: SamplingParams | None, source: str,
                 engine: Engine) -> None:
        """Encode a request's prompt (and compile its structure's grammar), then hand them to the engine thread,
        unless it was aborted meanwhile."""
        encoder = getattr(engine, "prompts", None)
        try:
            ids = encoder.encode(prompt) if encoder is not None else prompt  # None: the engine thread encodes
            constraint = engine.constraint_for(sampling) if sampling is not None and encoder is not None else None
        except Exception as exc:
            with self._lock:
                wanted = request_id in self._preparing
                self._preparing.discard(request_id)
            if wanted:
                self._deliver(request_id, exc)
            return
        with self._lock:
            if request_id not in self._preparing or self.failure is not None:
                return
            self._preparing.discard(request_id)
            self._commands.put(("add", (request_id, prompt, ids, sampling, source, encoder, engine, constraint)))

    # -- the engine thread --------------------------------------------------------------------------

    def _run(self, factory: Callable[[], Engine], loaded: Future) -> None:
        try:
            self._models.add(factory())
        except BaseException as exc:  # reported to the constructor's caller
            self.failure = f"the model did not load: {exc}"
            loaded.set_exception(exc)
            return
        self._refresh_stats(self._engine)
        loaded.set_result(None)
        try:
            self._serve()
        except BaseException as exc:  # the last line of defence: nobody may wait for ever
            log.exception("the engine thread failed")
            self._die(f"the engine stopped: {describe_failure(exc)}")
            return
        for engine in self._models:
            if engine.has_model:
                engine.abort_all()
                self._dispatch(engine.step())
        self._end_streams(SHUTDOWN_MESSAGE)
        for engine in self._models:
            engine.close()  # the disk tier's pending blocks, bounded

    def _serve(self) -> None:
        last_stats: dict[int, float] = {}
        while not self._stopping:
            self._drain_commands(block=not self._models.with_work())
            if self._stopping:
                break
            if not self._engine.has_model:
                raise EngineDeadError("no model is loaded: the previous one could not be loaded again")
            for engine in self._models.with_work():  # one step each, in turn: their replies advance together
                outputs = self._safe_step(engine)
                now = time.monotonic()
                # a caller handed its final output sees stats that count it: the snapshot is taken before delivery
                if now - last_stats.get(id(engine), 0.0) >= STATS_INTERVAL_S or not engine.has_unfinished() or any(
                        out.finished for out in outputs):
                    self._refresh_stats(engine)
                    last_stats[id(engine)] = now
                self._dispatch(outputs)
            if self.idle_unload_s is not None:
                for engine in self._models.idle(self.idle_unload_s):
                    log.info("unloading %s: no chat has used it for %.0f s", model_id(engine), self.idle_unload_s)
                    self._unload(engine)

    def _refresh_stats(self, engine: Engine) -> None:
        stats = engine.stats()
        self._model_stats[model_id(engine)] = stats
        if engine is self._engine:
            self._stats = stats

    def _adopt(self, engine: Engine) -> str:
        """On the engine thread: make a model loaded elsewhere resident."""
        new_id = self._models.add(engine)
        self._refresh_stats(engine)
        return new_id

    def _unload(self, engine: Engine) -> None:
        """On the engine thread: end ``engine``'s replies and give its memory back."""
        if len(self._models) == 1:
            raise ValueError(f"{model_id(engine)} is the only model loaded; switch it to another instead")
        old_id = model_id(engine)
        self._models.remove(engine)
        self._model_stats.pop(old_id, None)
        self._dispatch(engine.unload(UNLOADED_MESSAGE))
        if self._engine is not None:
            self._refresh_stats(self._engine)

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "add":
            self._add(*payload)
        elif kind == "abort":
            for engine in self._models:
                engine.abort(payload)
        elif kind == "call":
            fn, future, model = payload
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self._resolve(model) if model is not None else self._engine))
                except BaseException as exc:
                    future.set_exception(exc)
        elif kind == "stop":
            self._stopping = True

    def _add(self, request_id: str, prompt: Prompt, ids: list[int], sampling: SamplingParams | None, source: str,
             encoder, engine: Engine, constraint=None) -> None:
        if engine not in list(self._models) or not engine.has_model:  # unloaded since the request was made
            self._deliver(request_id, EngineDeadError(UNLOADED_MESSAGE))
            return
        if encoder is not None and encoder is not engine.prompts:  # encoded for a model since switched out
            with self._lock:
                self._preparing.add(request_id)
            try:
                self._encoder.submit(self._prepare, request_id, prompt, sampling, source, engine)
            except RuntimeError:  # shutting down
                self._deliver(request_id, EngineDeadError(SHUTDOWN_MESSAGE))
            return
        try:
            engine.add_request(ids, sampling, request_id=request_id, source=source, constraint=constraint)
        except Exception as exc:
            self._deliver(request_id, exc)
            return
        self._models.touch(engine)

    @staticmethod
    def _safe_step(engine: Engine) -> list[RequestOutput]:
        """A step; the engine isolates failures itself, and anything that still escapes ends the live
        requests with the reason and starts the scheduler afresh."""
        try:
            return engine.step()
        except Exception as exc:
            log.exception("engine step failed")
            return engine.fail_all(f"the engine failed: {describe_failure(exc)}")

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._deliver(out.request_id, out)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        """Hand ``item`` to the request's stream; a final item (finished output or error) unregisters it."""
        final = isinstance(item, BaseException) or item.finished
        with self._lock:
            entry = self._streams.pop(request_id, None) if final else self._streams.get(request_id)
        if entry is not None:
            self._send(request_id, entry, item)

    def _send(self, request_id: str, entry, item: RequestOutput | BaseException) -> None:
        loop, ref = entry
        stream = ref()
        try:
            if stream is None:
                raise LookupError("dropped by its caller")
            loop.call_soon_threadsafe(stream._deliver, item)
        except (LookupError, RuntimeError):  # nobody reads it any more (or its loop has closed): stop it
            self.abort(request_id)
            with self._lock:
                self._streams.pop(request_id, None)

    def _die(self, reason: str) -> None:
        """The thread can't go on: tell the owner, then end every stream and pending call now (in that order,
        so whoever sees a stream end can already see why)."""
        with self._lock:
            self.failure = reason
        if self._on_failure is not None:
            try:
                self._on_failure(reason)
            except Exception:
                log.exception("the engine's failure callback raised")
        self._end_streams(reason)

    def _end_streams(self, reason: str) -> None:
        """Mark the engine stopped and end every open stream and queued call with :class:`EngineDeadError`."""
        with self._lock:
            self.failure = self.failure or reason
            streams, self._streams = self._streams, {}
            self._preparing.clear()
        for request_id, entry in streams.items():
            self._send(request_id, entry, EngineDeadError(reason))
        self._fail_queued_commands(reason)

    def _fail_queued_commands(self, reason: str) -> None:
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "call":
                future = payload[1]
                if future.set_running_or_notify_cancel():
                    future.set_exception(EngineDeadError(reason))

    def _raise_if_dead(self) -> None:
        if self.failure is not None:
            raise EngineDeadError(self.failure)


def _is_token_ids(prompt: Prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and all(is_token_id(t) for t in prompt)
