"""Kvasir's OpenAI-compatible HTTP endpoint over the engine (Starlette + uvicorn). No Qt in here.

- ``config.py``: where it listens and the API key; ``security.py``: who may use it
- ``protocol.py``: request bodies into prompts and :class:`SamplingParams`; ``responses.py``: OpenAI's shapes
- ``errors.py``: errors in OpenAI's shape; ``server.py``: the routes; ``service.py``: the server on its thread

Starlette and uvicorn are imported only when the server is first used, so the engine runs where they are not
installed (a bare machine with torch and transformers only, as ``engine/tools/gpu_check.py`` expects).
"""

from importlib import import_module

from .config import API_KEY_ENV, API_SOURCE, DEFAULT_HOST, DEFAULT_PORT, ApiConfig, ApiConfigError, is_loopback

_LAZY = {"create_app": ".server", "ApiServer": ".service", "ServerStartError": ".service"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "API_KEY_ENV",
    "API_SOURCE",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ApiConfig",
    "ApiConfigError",
    "ApiServer",
    "ServerStartError",
    "create_app",
    "is_loopback",
]
