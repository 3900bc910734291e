"""Kvasir's OpenAI-compatible HTTP endpoint over the engine (Starlette + uvicorn). No Qt in here.

- ``config.py``: where it listens and the API key; ``security.py``: who may use it
- ``protocol.py``: request bodies into prompts and :class:`SamplingParams`; ``responses.py``: OpenAI's shapes
- ``errors.py``: errors in OpenAI's shape; ``server.py``: the routes; ``service.py``: the server on its thread
"""

from .config import API_KEY_ENV, DEFAULT_HOST, DEFAULT_PORT, ApiConfig, ApiConfigError, is_loopback
from .server import API_SOURCE, create_app
from .service import ApiServer, ServerStartError

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
