"""Models the endpoint loads when a request names one: a library model that is not resident is loaded beside the
others (the least recently used ones without work are unloaded first where it would not fit), so a client can
ask for any model ``GET /v1/models`` lists as available.

Two requests for the same model while it loads share the one load. The app's own endpoint does not load on
demand: there the user decides what takes the memory (and is asked before a model is unloaded).
"""

from __future__ import annotations

import asyncio
import dataclasses

from ..config import EngineConfig
from ..models.library import ModelLibrary
from ..serving.resident import room_for, split_model_spec


class NotLoadable(LookupError):
    """The name is no library model (nor one at a known quantisation)."""


class NoRoom(RuntimeError):
    """The model does not fit even with every idle model but the first unloaded."""


class OnDemandModels:
    """Loads library models on demand; ``base``: the configuration whose options new models take (device,
    KV format, ...). ``estimate``: the fit estimate (:func:`engine.models.fit.estimate`, the default)."""

    def __init__(self, base: EngineConfig, library: ModelLibrary | None = None, estimate=None) -> None:
        self.base = dataclasses.replace(base, draft_model=None,
                                        speculation="auto" if base.speculation == "draft" else base.speculation)
        self.library = library or ModelLibrary()
        self._estimate = estimate
        self._loads: dict[str, asyncio.Task] = {}

    def available(self, resident: list[str]) -> list[str]:
        """The library's models that are not resident (by name)."""
        return [e.name for e in self.library.entries() if e.name not in resident]

    def config(self, name: str) -> EngineConfig:
        """The configuration that loads ``name`` (``NAME`` or ``NAME@QUANT``); :class:`NotLoadable` where the
        library has no such model."""
        try:
            base, quant = split_model_spec(name)
        except ValueError as exc:
            raise NotLoadable(str(exc)) from None
        spec = next((e.spec for e in self.library.entries() if base in (e.name, e.spec)), None)
        if spec is None:
            raise NotLoadable(name)
        return dataclasses.replace(self.base, model=spec, quantization=quant)

    async def load(self, engine, name: str) -> str:
        """Load ``name`` into ``engine`` (an :class:`~engine.AsyncEngine`) and return its id; a load under way for
        the same name is awaited instead. Raises :class:`NotLoadable`, :class:`NoRoom`, or what the load raises."""
        config = self.config(name)
        task = self._loads.get(name)
        if task is None:
            task = asyncio.ensure_future(self._make_room_and_load(engine, config))
            self._loads[name] = task
            task.add_done_callback(lambda _: self._loads.pop(name, None))
        return await asyncio.shield(task)

    async def _make_room_and_load(self, engine, config: EngineConfig) -> str:
        for model in self.room_for(engine, config):
            await engine.unload_model(model)
        return await engine.load_model(config)

    def room_for(self, engine, config: EngineConfig) -> list[str]:
        """The models to unload for ``config`` to fit: the least recently used first, never the first model or
        one with replies to write; :class:`NoRoom` where even all of them would not make room."""
        busy = {i for i in engine.model_ids() if not _idle(engine.stats(i))}
        chosen = room_for(engine, config, {engine.model_id(), *busy}, self._estimate)
        if chosen is None:
            raise NoRoom(f"{config.model} ({config.quantization}) does not fit in memory beside the models loaded "
                         "now, even with the idle ones unloaded")
        return chosen


def _idle(stats) -> bool:
    return stats.num_running == 0 and stats.num_waiting == 0
