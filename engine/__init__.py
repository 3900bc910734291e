"""Kvasir's inference engine: paged KV cache, prefix caching, continuous batching. No Qt in here."""

from .async_engine import AsyncEngine
from .config import EngineConfig
from .engine import Engine
from .errors import EngineDeadError, EngineError, ModelLoadError, UnsupportedModelError
from .metrics import EngineStats, RequestMetrics
from .outputs import RequestOutput
from .sampling import SamplingParams

__all__ = [
    "AsyncEngine",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineStats",
    "ModelLoadError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "UnsupportedModelError",
]
