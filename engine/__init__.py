"""Kvasir's inference engine: paged KV cache, prefix caching, continuous batching. No Qt in here.

This module is the engine's only door: the app and the checks import from ``engine`` itself.

- ``serving/``: the engine, its thread, the scheduler, the block manager, requests and metrics
- ``step/``: one forward pass (runner, paged attention), sampling, detokenising, quantised layers
- ``models/``: model files (sources, GGUF, weight checks, loading, the library, the fit estimate)
- ``tools/``: the command line, the benchmark, the quantisation evaluation
- ``api/``: the OpenAI-compatible HTTP endpoint (Starlette + uvicorn, imported when the server is first used,
  so the engine itself needs torch and transformers only)
"""

from importlib import import_module

from .api.config import API_SOURCE, ApiConfig, ApiConfigError
from .api.config import DEFAULT_HOST as DEFAULT_API_HOST
from .api.config import DEFAULT_PORT as DEFAULT_API_PORT
from .config import AUTO_QUANTIZATION_RULE, DTYPES, QUANTIZATIONS, WEIGHT_MODES, EngineConfig
from .errors import (
    DownloadCancelled,
    EngineDeadError,
    EngineError,
    HubError,
    LibraryError,
    ModelLoadError,
    PromptTooLong,
    UnsupportedModelError,
)
from .models.fit import FitEstimate
from .models.fit import estimate as estimate_fit
from .models.hub_download import DownloadProgress, HubDownload
from .models.hub_fit import HubFit
from .models.hub_fit import fit_options as fit_hub_options
from .models.hub_search import HubModel, HubOption, HubRepo
from .models.hub_search import repo_options as hub_repo_options
from .models.hub_search import search_models as search_hub
from .models.library import LibraryEntry, ModelLibrary, data_dir
from .models.sources import DEFAULT_MODEL_NAME, DEFAULT_MODEL_PACKAGE
from .sampling_params import CHAT_SAMPLING, SamplingParams
from .serving.async_engine import AsyncEngine
from .serving.engine import Engine
from .serving.metrics import EngineStats, FirstToken, GpuUsage, RequestMetrics, RequestSnapshot
from .serving.outputs import RequestOutput

__all__ = [
    "API_SOURCE",
    "AUTO_QUANTIZATION_RULE",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_PACKAGE",
    "DTYPES",
    "QUANTIZATIONS",
    "ApiConfig",
    "ApiConfigError",
    "ApiServer",
    "AsyncEngine",
    "DEFAULT_API_HOST",
    "DEFAULT_API_PORT",
    "DownloadCancelled",
    "DownloadProgress",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineStats",
    "FirstToken",
    "FitEstimate",
    "GpuUsage",
    "HubDownload",
    "HubError",
    "HubFit",
    "HubModel",
    "HubOption",
    "HubRepo",
    "LibraryEntry",
    "LibraryError",
    "ModelLibrary",
    "ModelLoadError",
    "PromptTooLong",
    "RequestMetrics",
    "RequestOutput",
    "RequestSnapshot",
    "SamplingParams",
    "CHAT_SAMPLING",
    "ServerStartError",
    "UnsupportedModelError",
    "WEIGHT_MODES",
    "data_dir",
    "estimate_fit",
    "fit_hub_options",
    "hub_repo_options",
    "search_hub",
]


def __getattr__(name: str):
    """The API server's classes, imported on first use (they need Starlette and uvicorn)."""
    if name in ("ApiServer", "ServerStartError"):
        return getattr(import_module(".api.service", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
