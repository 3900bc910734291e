"""The one place that holds the engine. Loads it in the background and turns its work into Qt signals.

The engine's own thread does every torch call; this object only forwards requests to it and relays what
comes back, so the GUI thread never runs torch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Protocol

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from engine import (
    AsyncEngine,
    Chat,
    EngineConfig,
    EngineStats,
    RequestOutput,
    SamplingParams,
    Structure,
    check_kv_formats,
)
from engine.serving.resident import room_for

STATS_INTERVAL_MS = 250


class ReplyStream(Protocol):
    """A reply being generated: ``async for`` its outputs; leaving the loop stops it."""

    request_id: str

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...


class ChatEngine(Protocol):
    """What the window and the controller use of the engine. :class:`EngineBridge` is the real one; the tests'
    scripted bridge provides the same.

    Signals: ``load_progress(fraction, phrase)``, ``loaded(EngineStats)`` (also when the chat on screen moves to
    another resident model), ``load_failed(reason)``, ``stats_updated(EngineStats)``, ``models_updated(dict)``
    (every resident model's stats by id), ``engine_failed(reason)``.
    """

    load_progress: Signal
    loaded: Signal
    load_failed: Signal
    stats_updated: Signal
    models_updated: Signal
    engine_failed: Signal
    config: EngineConfig | None  # the configuration of the model on screen (or loading)
    resident: dict[str, EngineConfig]  # every resident model's id and the configuration that loaded it
    focused: str | None  # the id of the model on screen
    loading: bool
    failure: str | None
    load_error: str | None

    @property
    def ready(self) -> bool: ...

    @property
    def serving(self) -> bool: ...

    def start(self, config: EngineConfig) -> None: ...

    async def switch(self, config: EngineConfig) -> None: ...

    async def show(self, config: EngineConfig) -> None: ...

    async def unload(self, model: str) -> None: ...

    def resident_id(self, config: EngineConfig) -> str | None: ...

    def reloads(self, config: EngineConfig) -> bool: ...

    def focus(self, model: str) -> None: ...

    def room_for(self, config: EngineConfig) -> list[str] | None: ...

    def restart(self) -> None: ...

    def shutdown(self) -> None: ...

    def stream(self, messages: list[dict] | Chat, sampling: SamplingParams,
               model: str | None = None) -> ReplyStream: ...

    def count_tokens(self, messages: list[dict] | Chat, model: str | None = None) -> int: ...

    def forced_call(self, tools: list[dict], name: str | None, model: str | None = None) -> Structure: ...

    def stats(self, model: str | None = None) -> EngineStats | None: ...

    def all_stats(self) -> dict[str, EngineStats]: ...

    def set_cpu_options(self, threads: int | None, lower_priority: bool) -> Future | None: ...

    def set_speculation(self, mode: str) -> Future | None: ...

    def set_idle_unload(self, seconds: float | None) -> None: ...

    def check_kv_formats(self) -> Future | None: ...

    def clear_disk_cache(self) -> Future | None: ...


class EngineBridge(QObject):
    """Owns the :class:`AsyncEngine`; emits load progress, load results, stats snapshots and engine failures.

    One load runs at a time: a switch asked for while the first model loads waits for it and then runs (the
    latest one asked for wins), so there is never a second engine thread holding a model nobody uses.

    Several models may be resident (:meth:`show` loads one beside the others, :meth:`unload` gives one back); the
    one on screen (``focused``) is what ``config``, :meth:`stats` and a request naming no model mean.
    """

    load_progress = Signal(float, str)
    loaded = Signal(object)  # EngineStats
    load_failed = Signal(str)
    stats_updated = Signal(object)  # EngineStats of the model on screen
    models_updated = Signal(object)  # {model id: EngineStats} of every resident model
    engine_failed = Signal(str)  # the engine thread died; the reason
    _load_done = Signal(object, str)  # from the load thread: the engine or None, and why it failed
    _died = Signal(int, str)  # from the engine thread: which engine (generation), and why

    def __init__(self, parent: QObject | None = None, engine_factory: Callable[..., AsyncEngine] = AsyncEngine) -> None:
        super().__init__(parent)
        self.engine: AsyncEngine | None = None
        self.config: EngineConfig | None = None
        self.resident: dict[str, EngineConfig] = {}
        self.focused: str | None = None
        self.idle_unload_s: float | None = None  # models other than the first unused this long are unloaded
        self.loading = False
        self.load_error: str | None = None  # why the last load failed
        self.failure: str | None = None  # why the engine stopped serving; None while it serves
        self._factory = engine_factory
        self._pending: EngineConfig | None = None  # a switch asked for while a background load runs
        self._background_load = False  # a load thread is running (``loading`` also covers switches)
        self._loading_config: EngineConfig | None = None  # what the background load was started with
        self._generation = 0  # tells a dead engine's late report from the current engine's
        self._closed = False
        self._lock = threading.Lock()  # orders a load finishing against shutdown()
        self._timer = QTimer(self)
        self._timer.setInterval(STATS_INTERVAL_MS)
        self._timer.timeout.connect(self._poll_stats)
        self._load_done.connect(self._finish_load, Qt.QueuedConnection)
        self._died.connect(self._engine_died, Qt.QueuedConnection)

    @property
    def ready(self) -> bool:
        """True when a model is loaded and the engine serves requests."""
        engine = self.engine
        return engine is not None and not self.loading and self.failure is None and engine.alive

    @property
    def serving(self) -> bool:
        """True while an engine is up, even during a switch (a failed switch leaves the old model serving)."""
        engine = self.engine
        return engine is not None and self.failure is None and engine.alive

    def start(self, config: EngineConfig) -> None:
        """Load a model in a background thread (the window stays responsive); during a load, queue it."""
        if self._background_load:
            self._pending = config
            return
        self._background_load = True
        self.config, self.loading, self.load_error, self.failure = config, True, None, None
        self._loading_config = config
        self._generation += 1
        threading.Thread(target=self._load, args=(config, self._generation), name="kvasir-load", daemon=True).start()

    def _load(self, config: EngineConfig, generation: int) -> None:
        try:
            engine = self._factory(config, progress=self._report_progress,
                                   on_failure=lambda reason: self._died.emit(generation, reason))
        except Exception as exc:  # shown to the user in words
            self._load_done.emit(None, str(exc) or type(exc).__name__)
            return
        with self._lock:
            orphan = self._closed
            if not orphan:
                self.engine = engine
        if orphan:  # the app quit while this model loaded: nobody will use it, so free it now
            engine.shutdown()
            return
        self._load_done.emit(engine, "")

    def _finish_load(self, engine: AsyncEngine | None, error: str) -> None:
        """On the GUI thread: run a switch that waited for this load, or report the load's result."""
        self.loading = self._background_load = False
        pending, self._pending = self._pending, None
        if self._closed:
            return
        if engine is None and pending is not None:
            self.start(pending)  # the user has asked for another model since; the failed one no longer matters
        elif engine is None:
            self.load_error = error
            self.load_failed.emit(error)
        else:
            self.focused = engine.model_id()
            self.resident = {self.focused: self.config}
            engine.idle_unload_s = self.idle_unload_s
            self._timer.start()
            self._catch_up_cpu_options(engine)
            self.loaded.emit(engine.stats())
            if pending is not None:
                asyncio.ensure_future(self.switch(pending))

    def _catch_up_cpu_options(self, engine: AsyncEngine) -> None:
        """CPU options or the speculation mode changed while the engine loaded with the earlier ones: give it
        the latest."""
        loaded_with, latest = self._loading_config, self.config
        if latest is None or loaded_with is None:
            return
        if (latest.threads, latest.lower_priority) != (loaded_with.threads, loaded_with.lower_priority):
            engine.call(lambda serving: serving.set_cpu_options(latest.threads, latest.lower_priority))
        if latest.speculation != loaded_with.speculation:
            engine.call(lambda serving: serving.set_speculation(latest.speculation))

    def _report_progress(self, fraction: float, phrase: str) -> None:
        self.load_progress.emit(fraction, phrase)

    async def switch(self, config: EngineConfig) -> None:
        """Load ``config`` in place of the model on screen (another model, quantisation or KV format); on failure
        the previous model keeps serving and load_failed says why.

        With no engine yet (or a dead one) this loads ``config`` in the background; during the first load it
        is queued behind it."""
        if not self._engine_serves():
            self._replace_engine(config)
            return
        self.loading = True
        old = self.focused
        try:
            before = set(self.engine.model_ids()) - {old}
            await self.engine.switch_model(config, progress=self._report_progress, model=old)
        except Exception as exc:
            self.load_error = str(exc)
            self.load_failed.emit(str(exc))
        else:
            new = next(i for i in self.engine.model_ids() if i not in before)
            self.resident = {(new if i == old else i): (config if i == old else c) for i, c in self.resident.items()}
            self.focus(new)
        finally:
            self.loading = False

    async def show(self, config: EngineConfig) -> None:
        """The chat on screen runs on ``config``'s model: at once where it is resident with the same load options,
        reloaded in place where only its options differ (KV format, draft), else loaded beside the others
        (the caller makes room first, see :meth:`room_for`). On failure load_failed says why and the model
        on screen stays."""
        if not self._engine_serves():
            self._replace_engine(config)
            return
        found = self.resident_id(config)
        if found is not None and not self.reloads(config):
            self.focus(found)
        elif found is not None:
            self.focused = found
            await self.switch(config)
        else:
            await self._load_beside(config)

    async def _load_beside(self, config: EngineConfig) -> None:
        self.loading = True
        try:
            new = await self.engine.load_model(config, progress=self._report_progress)
        except Exception as exc:
            self.load_error = str(exc)
            self.load_failed.emit(str(exc))
        else:
            self.resident[new] = config
            self.focus(new)
        finally:
            self.loading = False

    async def unload(self, model: str) -> None:
        """Unload the resident model ``model`` (an id): its replies end saying so and its memory goes back; the
        model on screen moves to the first resident one when it was that model."""
        await self.engine.unload_model(model)
        self.resident.pop(model, None)
        if self.focused == model:
            self.focus(self.engine.model_id())
        else:
            self._poll_stats()

    def resident_id(self, config: EngineConfig) -> str | None:
        """The id of the resident model loaded from ``config``'s model at its quantisation, None where there is
        none."""
        return next((i for i, c in self.resident.items()
                     if (c.model, c.quantization) == (config.model, config.quantization)), None)

    def reloads(self, config: EngineConfig) -> bool:
        """Whether showing ``config`` rebuilds a resident model in place (the same model, other load options)."""
        found = self.resident_id(config)
        return found is not None and load_options(self.resident[found]) != load_options(config)

    def room_for(self, config: EngineConfig, estimate=None) -> list[str] | None:
        """The resident models to unload, least recently used first, for ``config``'s model to fit beside the
        rest: [] where it fits now (or is resident), None where it would not fit even with every other model
        unloaded. The model on screen is never among them (see :func:`engine.serving.resident.room_for`)."""
        if not self._engine_serves() or self.resident_id(config) is not None:
            return []
        return room_for(self.engine, config, {self.focused}, estimate)

    def focus(self, model: str) -> None:
        """Show ``model`` (a resident id) as the model on screen."""
        self.focused, self.config = model, self.resident[model]
        self.loaded.emit(self.engine.stats(model))
        self._poll_stats()

    def _engine_serves(self) -> bool:
        return self.engine is not None and self.failure is None and self.engine.alive

    def restart(self) -> None:
        """Shut the dead engine down and load a fresh one with the last configuration, in the background."""
        if self.config is not None:
            self._replace_engine(self.config)

    def _replace_engine(self, config: EngineConfig) -> None:
        if self._background_load:
            self._pending = config
            return
        old, self.engine = self.engine, None
        if old is not None:
            old.shutdown()  # its thread has stopped (or never served), so this returns at once
        self.start(config)

    def _engine_died(self, generation: int, reason: str) -> None:
        if generation != self._generation or self._closed:
            return  # an engine already replaced, or the app is closing
        self.failure = reason
        self._timer.stop()
        self.engine_failed.emit(reason)

    def stream(self, messages: list[dict] | Chat, sampling: SamplingParams,
               model: str | None = None) -> ReplyStream:
        """Stream a reply to chat ``messages`` on the resident model ``model`` (None: the one on screen); leaving
        the loop stops it."""
        return self.engine.stream(messages, sampling, model=model or self.focused)

    def forced_call(self, tools: list[dict], name: str | None, model: str | None = None) -> Structure:
        """The form of a reply on ``model`` (None: the one on screen) that calls the tool ``name`` (None: any of
        ``tools``): a grammar in that model's tool-call format."""
        return self.engine.forced_call(tools, name, model or self.focused)

    def count_tokens(self, messages: list[dict] | Chat, model: str | None = None) -> int:
        """Prompt tokens of ``messages`` with the chat template of ``model`` (None: the one on screen), as the
        engine will count them (any thread). ``PromptTooLong`` when they hold more than the context can;
        ``ValueError`` when the template refuses them."""
        return len(self.engine.encode_prompt(messages, model or self.focused))

    def stats(self, model: str | None = None) -> EngineStats | None:
        """The latest snapshot of ``model`` (None: the one on screen), or None before the first model has
        loaded."""
        if self.engine is None:
            return None
        try:
            return self.engine.stats(model or self.focused)
        except LookupError:  # unloaded since: the first resident model's
            return self.engine.stats()

    def all_stats(self) -> dict[str, EngineStats]:
        """Every resident model's latest snapshot, by id, in the order they were loaded."""
        if self.engine is None:
            return {}
        every = self.engine.all_stats()
        return {i: every[i] for i in self.engine.model_ids() if i in every}

    def set_cpu_options(self, threads: int | None, lower_priority: bool) -> Future | None:
        """The engine's CPU threads (None: adapt) and priority, now, between two steps; kept for later loads.
        Returns the engine's future for the change (None while no engine serves)."""
        options = {"threads": threads, "lower_priority": lower_priority}
        if self.config is not None:
            self.config = dataclasses.replace(self.config, **options)
        if self._pending is not None:
            self._pending = dataclasses.replace(self._pending, **options)
        return self._on_every_model(lambda engine: engine.set_cpu_options(threads, lower_priority))

    def set_speculation(self, mode: str) -> Future | None:
        """Speculative decoding's mode (``engine.SPECULATION_MODES``), now, between two steps; kept for later
        loads. Returns the engine's future for the change (None while no engine serves)."""
        if self.config is not None:
            self.config = dataclasses.replace(self.config, speculation=mode)
        if self._pending is not None:
            self._pending = dataclasses.replace(self._pending, speculation=mode)
        return self._on_every_model(lambda engine: engine.set_speculation(mode))

    def _on_every_model(self, change) -> Future | None:
        """Run ``change(engine)`` for every resident model on the engine thread; the future of the last, which
        the engine thread runs after the others (None while no engine serves)."""
        if self.engine is None or not self.engine.alive:
            return None
        futures = [self.engine.call(change, model) for model in self.resident or [None]]
        return futures[-1]

    def check_kv_formats(self) -> Future | None:
        """The serving model's KV cache formats against a float32 cache (:func:`engine.check_kv_formats`), on
        the engine thread: replies pause while it runs. None while no engine serves."""
        if self.engine is None or not self.engine.alive:
            return None
        return self.engine.call(check_kv_formats, self.focused)

    def clear_disk_cache(self) -> Future | None:
        """Delete the serving model's KV blocks on disk (on the engine thread); the future gives the bytes freed.
        None while no engine serves."""
        if self.engine is None or not self.engine.alive:
            return None
        return self.engine.call(lambda engine: engine.clear_disk_cache(), self.focused)

    def set_idle_unload(self, seconds: float | None) -> None:
        """Unload a model other than the first once no chat has used it for ``seconds`` (None: never)."""
        self.idle_unload_s = seconds
        if self.engine is not None:
            self.engine.idle_unload_s = seconds

    def _poll_stats(self) -> None:
        if self.engine is None:
            return
        every = self.all_stats()
        if self.resident and not self.loading and set(self.resident) - set(every):
            self._forget_unloaded(every)
        self.models_updated.emit(every)  # first: the model on screen's numbers count the others' memory
        self.stats_updated.emit(self.stats())

    def _forget_unloaded(self, every: dict[str, EngineStats]) -> None:
        """Models the engine unloaded by itself (idle): forgotten, and the first one shown where it was on screen."""
        self.resident = {i: c for i, c in self.resident.items() if i in every}
        if self.focused not in self.resident and self.resident:
            self.focused = next(iter(self.resident))
            self.config = self.resident[self.focused]
            self.loaded.emit(self.engine.stats(self.focused))

    def shutdown(self) -> None:
        """Stop the engine thread; a model still loading is shut down as soon as its load finishes."""
        self._timer.stop()
        with self._lock:
            self._closed = True
            engine = self.engine
        self._pending = None
        if engine is not None:
            engine.shutdown()


def load_options(config: EngineConfig) -> tuple:
    """What a model is loaded with besides its name and quantisation: a change reloads it."""
    return (config.device, config.dtype, config.kv_cache_dtype, config.kv_disk_cache, config.draft_model)


async def wait_for(signal, timeout: float):
    """Await the next emission of a Qt ``signal`` (its arguments), inside the qasync loop."""
    future = asyncio.get_running_loop().create_future()

    def done(*args):
        if not future.done():
            future.set_result(args)

    signal.connect(done)
    try:
        return await asyncio.wait_for(future, timeout)
    finally:
        signal.disconnect(done)


def not_ready_message(bridge: ChatEngine) -> str:
    """What the status bar says when a message can't be sent yet; the text stays in the box either way."""
    if bridge.failure is not None:
        return "The engine has stopped; restart it from the bar above. Your message is kept in the box."
    if bridge.load_error is not None and not bridge.loading:
        return "No model is loaded; try again or choose another model above. Your message is kept in the box."
    return "The model is still loading; your message is kept in the box."
