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

# name -> the module that defines it; each is imported on first use, so that a process that needs one small part
# (a chat template worker, the command line's --help) does not pay for torch and transformers
_EXPORTS = {
    ".api.config": ("API_SOURCE", "ApiConfig", "ApiConfigError"),
    ".api.service": ("ApiServer", "ServerStartError"),
    ".config": ("AUTO_QUANTIZATION_RULE", "DTYPES", "KV_CACHE_DTYPES", "QUANTIZATIONS", "SPECULATION_MODES",
                "WEIGHT_MODES", "EngineConfig"),
    ".errors": ("DownloadCancelled", "EngineDeadError", "EngineError", "HubError", "LibraryError",
                "ModelLoadError", "PromptTooLong", "UnsupportedModelError"),
    ".models.fit": ("FitEstimate",),
    ".models.hub_download": ("DownloadProgress", "HubDownload"),
    ".models.hub_fit": ("HubFit",),
    ".models.hub_search": ("HubModel", "HubOption", "HubRepo"),
    ".models.library": ("LibraryEntry", "ModelLibrary", "data_dir"),
    ".models.sources": ("DEFAULT_MODEL_NAME", "DEFAULT_MODEL_PACKAGE"),
    ".sampling_params": ("CHAT_SAMPLING", "SamplingParams", "Structure"),
    ".serving.async_engine": ("AsyncEngine",),
    ".serving.engine": ("Engine",),
    ".serving.metrics": ("CpuUsage", "DiskCacheStats", "EngineStats", "FirstToken", "GpuUsage", "RequestMetrics",
                         "RequestSnapshot", "SpeculationStats"),
    ".serving.outputs": ("RequestOutput",),
    ".serving.prompt_encoder": ("Chat",),
    ".tools.kv_evaluation": ("KVQuality", "check_kv_formats"),
}
# exported under another name: public name -> (module, its name there)
_RENAMED = {
    "DEFAULT_API_HOST": (".api.config", "DEFAULT_HOST"),
    "DEFAULT_API_PORT": (".api.config", "DEFAULT_PORT"),
    "estimate_fit": (".models.fit", "estimate"),
    "fit_hub_options": (".models.hub_fit", "fit_options"),
    "hub_repo_options": (".models.hub_search", "repo_options"),
    "search_hub": (".models.hub_search", "search_models"),
}
_WHERE = {name: (module, name) for module, names in _EXPORTS.items() for name in names} | _RENAMED

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """An exported name, imported from its module on first use and kept."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _WHERE[name]
    value = getattr(import_module(module, __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
