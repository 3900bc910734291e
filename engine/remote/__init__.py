"""Remote engines: OpenAI-compatible servers (vLLM, SGLang, llama.cpp's llama-server, Ollama, another Kvasir).

- ``server_url.py``: a server's address, where its API and its metrics live
- ``sse.py``: server-sent events, line by line
- ``client.py``: ``/v1/models`` and streamed ``/v1/chat/completions`` as the engine's own ``RequestOutput``s
- ``errors.py``: what went wrong, in words
- ``metrics.py``: the server's Prometheus ``/metrics``, read as KV usage and prefix hit rate
"""

from .client import RemoteClient, RemoteModel, RemoteStream
from .errors import RemoteError
from .metrics import ServerMetrics, parse_prometheus, read_server_metrics
from .server_url import RemoteConfig

__all__ = ["RemoteClient", "RemoteConfig", "RemoteError", "RemoteModel", "RemoteStream", "ServerMetrics",
           "parse_prometheus", "read_server_metrics"]
