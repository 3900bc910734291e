"""The models resident in one engine thread, each an :class:`.engine.Engine` of its own, by id.

Each model keeps its own weights, KV pool, block manager, scheduler and prefix cache. Models differ in what a
token's KV is (layers, heads, head size, format), so one pool would hold blocks of several sizes; separate pools
keep every block table, hash and eviction rule exactly as it is for one model, and on the CPU a pool costs only
the pages its blocks have written. One thread steps every model with work in turn (:mod:`.async_engine`), so
replies on different models are written at the same time.

A model's id is its name, with ``@QUANT`` where it was loaded at a quantisation asked for by name (so
``default`` and ``default@none`` serve side by side as ``SmolLM2-135M-Instruct`` and
``SmolLM2-135M-Instruct@none``). A request may also name a model by what loaded it (``default``), or by its name
and the quantisation it runs at.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

from ..config import QUANTIZATIONS, EngineConfig
from .engine import Engine

SEPARATOR = "@"


def split_model_spec(text: str) -> tuple[str, str]:
    """``NAME@QUANT`` as (name, quantisation); a name alone runs at ``auto``. Raises ``ValueError`` naming the
    quantisations for an unknown one (a path holding ``@`` keeps it: only a known quantisation is split off)."""
    name, sep, quant = text.rpartition(SEPARATOR)
    if not sep or not name:
        return text, "auto"
    if quant in QUANTIZATIONS:
        return name, quant
    if "/" in quant or "." in quant:  # part of a path or file name
        return text, "auto"
    raise ValueError(f"{text!r}: {quant!r} is not a quantisation; one of {', '.join(QUANTIZATIONS)}")


def model_id(engine: Engine) -> str:
    """The id clients name the model by (see the module's text)."""
    name = engine.loaded.source.name
    return name if engine.config.quantization == "auto" else f"{name}{SEPARATOR}{engine.loaded.quantization}"


def answers_to(engine: Engine, name: str) -> bool:
    """Whether a request naming ``name`` means this model: its id, the spec that loaded it, or its name with the
    quantisation it runs at."""
    loaded = engine.loaded
    spec = engine.config.model if engine.config.quantization == "auto" else (
        f"{engine.config.model}{SEPARATOR}{engine.config.quantization}")
    return name in (model_id(engine), spec, f"{loaded.source.name}{SEPARATOR}{loaded.quantization}")


class ResidentModels:
    """Engines by model id, least recently used first; the first loaded is the primary until another is made so
    (the app's window serves the primary and switches it; a request naming no model goes there)."""

    def __init__(self) -> None:
        self._engines: list[Engine] = []  # least recently used first
        self._primary: Engine | None = None
        self._used_at: dict[int, float] = {}  # id(engine) -> when a request last went to it (monotonic)
        self._loads = 0
        self._load_order: dict[int, int] = {}  # id(engine) -> its place in the order the models were loaded

    def __len__(self) -> int:
        return len(self._engines)

    def __iter__(self) -> Iterator[Engine]:
        return iter(list(self._engines))

    @property
    def primary(self) -> Engine | None:
        return self._primary

    def ids(self) -> list[str]:
        """The resident models' ids in the order they were loaded."""
        engines = sorted(self._engines, key=lambda e: self._load_order[id(e)])
        return [model_id(engine) for engine in engines if engine.has_model]

    def add(self, engine: Engine) -> str:
        """Make ``engine`` resident; its id. Raises ``ValueError`` where a resident model has the same id or runs
        the same weights at the same quantisation."""
        new_id = model_id(engine)
        for other in self._engines:
            if not other.has_model:
                continue
            same = (other.loaded.source.name, other.loaded.quantization) == (
                engine.loaded.source.name, engine.loaded.quantization)
            if model_id(other) == new_id or same:
                raise ValueError(f"{engine.config.model} ({engine.loaded.quantization}) is already resident as "
                                 f"{model_id(other)!r}")
        self._engines.append(engine)
        self._used_at[id(engine)] = time.monotonic()
        self._load_order[id(engine)] = self._loads
        self._loads += 1
        if self._primary is None:
            self._primary = engine
        return new_id

    def remove(self, engine: Engine) -> None:
        self._engines.remove(engine)
        self._used_at.pop(id(engine), None)
        self._load_order.pop(id(engine), None)
        if self._primary is engine:
            self._primary = self._engines[0] if self._engines else None

    def find(self, name: str | None) -> Engine | None:
        """The model a request naming ``name`` means (None: the primary); None where no resident model answers."""
        if name is None:
            return self._primary
        exact = [e for e in self._engines if e.has_model and model_id(e) == name]
        if exact:
            return exact[0]
        return next((e for e in self._engines if e.has_model and answers_to(e, name)), None)

    def touch(self, engine: Engine) -> None:
        """``engine`` was just used: it is the last to be unloaded for room."""
        if engine not in self._engines:
            return
        self._used_at[id(engine)] = time.monotonic()
        if self._engines[-1] is not engine:
            self._engines.remove(engine)
            self._engines.append(engine)

    def idle(self, seconds: float) -> list[Engine]:
        """Models other than the primary that no request has gone to for ``seconds`` and that have no work."""
        now = time.monotonic()
        return [e for e in self._engines if e is not self._primary and not e.has_unfinished()
                and now - self._used_at.get(id(e), now) >= seconds]

    def with_work(self) -> list[Engine]:
        return [e for e in self._engines if e.has_model and e.has_unfinished()]


def config_for(spec: str, base: EngineConfig) -> EngineConfig:
    """``base`` with the model and quantisation of ``NAME@QUANT`` (see :func:`split_model_spec`)."""
    name, quant = split_model_spec(spec)
    return dataclasses.replace(base, model=name, quantization=quant)


def room_for(engine, config: EngineConfig, keep: set[str], estimate=None) -> list[str] | None:
    """The models resident in ``engine`` (an :class:`~engine.AsyncEngine`) to unload for ``config``'s model to fit
    beside the rest, least recently used first and none of ``keep``: [] where it fits now, None where it would not
    fit even with all of them unloaded. ``estimate``: the fit estimate (:func:`engine.models.fit.estimate`)."""
    if estimate is None:
        from ..models.fit import estimate
    candidates = [i for i in engine.least_recently_used() if i not in keep]
    freed, chosen = 0, []
    while not estimate(config, reclaimable_bytes=freed).fits:
        if not candidates:
            return None
        chosen.append(candidates.pop(0))
        stats = engine.stats(chosen[-1])
        freed += stats.model_memory_bytes + stats.kv_cache_memory_bytes
    return chosen
