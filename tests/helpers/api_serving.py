"""The endpoint over loopback on an engine of a test's own, and the official client pointed at it."""

from __future__ import annotations

from contextlib import contextmanager

import openai

from engine import ApiConfig, ApiServer, AsyncEngine, EngineConfig


@contextmanager
def serving(config: EngineConfig):
    """An engine on ``config`` behind a started endpoint on a free port: ``(server, client)``; both end after."""
    engine = AsyncEngine(config)
    server = ApiServer(lambda: engine, ApiConfig(port=0))
    server.start()
    try:
        yield server, openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    finally:
        server.stop()
        engine.shutdown()
