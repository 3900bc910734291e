"""llama.cpp's llama-server, built by `make peers`, serving the default GGUF on a free loopback port.

A missing binary fails the test that needs it, never skips it: `make test` builds the peers first."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from engine.models.sources import default_model_path
from engine.tools import peers

MODEL_ALIAS = "smollm2-135m"
API_KEY = "sk-kvasir-test"


@contextlib.contextmanager
def llama_server(api_key: str | None = API_KEY) -> Iterator[peers.LlamaServer]:
    """A running llama-server with --metrics and one alias; raises with `make peers` in the message if it is not
    built."""
    if peers.find_tool("llama-server") is None:
        raise AssertionError(peers.NOT_BUILT.format(tool="llama-server") + "; `make test` builds it")
    flags = ("--metrics", "-a", MODEL_ALIAS, "-np", "2") + (("--api-key", api_key) if api_key else ())
    with peers.server(default_model_path(), context=4096, threads=2, timeout=60, extra_args=flags) as server:
        yield server
