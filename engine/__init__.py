"""Kvasir's inference engine: paged KV cache, prefix caching, continuous batching. No Qt in here.

This module is the engine's only door: the app and the checks import from ``engine`` itself.

- ``serving/``: the engine, its thread, the scheduler, the block manager, requests and metrics
- ``step/``: one forward pass (runner, paged attention), sampling, detokenising, quantised layers
- ``models/``: model files (sources, GGUF, weight checks, loading, the library, the fit estimate)
- ``tools/``: the command line, the benchmark, the quantisation evaluation
"""

from .config import AUTO_QUANTIZATION_RULE, DTYPES, QUANTIZATIONS, WEIGHT_MODES, EngineConfig
from .errors import EngineDeadError, EngineError, LibraryError, ModelLoadError, UnsupportedModelError
from .models.fit import FitEstimate
from .models.fit import estimate as estimate_fit
from .models.library import LibraryEntry, ModelLibrary, data_dir
from .models.sources import DEFAULT_MODEL_NAME, DEFAULT_MODEL_PACKAGE
from .sampling_params import SamplingParams
from .serving.async_engine import AsyncEngine
from .serving.engine import Engine
from .serving.metrics import EngineStats, RequestMetrics, RequestSnapshot
from .serving.outputs import RequestOutput

__all__ = [
    "AUTO_QUANTIZATION_RULE",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_PACKAGE",
    "DTYPES",
    "QUANTIZATIONS",
    "AsyncEngine",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineStats",
    "FitEstimate",
    "LibraryEntry",
    "LibraryError",
    "ModelLibrary",
    "ModelLoadError",
    "RequestMetrics",
    "RequestOutput",
    "RequestSnapshot",
    "SamplingParams",
    "UnsupportedModelError",
    "WEIGHT_MODES",
    "data_dir",
    "estimate_fit",
]
