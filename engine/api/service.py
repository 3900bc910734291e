"""The endpoint on its own thread with its own asyncio loop (uvicorn), so it runs beside a window or alone.

The socket is bound before the thread starts, so a port in use is a clear error from :meth:`ApiServer.start`
rather than a log line in a thread. Connections that never finish their headers are closed at a deadline, and
past a cap new ones get a 503 (:mod:`.connections`); a log line repeated in a burst is written once.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

import uvicorn

from ..routing.router import Routes
from .config import ApiConfig
from .connections import ConnectionLimits, connection_cap
from .log_once import quieten_repeats
from .model_loader import OnDemandModels
from .server import EngineSource, create_app

START_TIMEOUT_S = 10
GRACEFUL_STOP_S = 2  # streams still open after this are cut


class ServerStartError(OSError):
    """The endpoint could not listen where it was asked to; the message says why and what to do."""


class _Server(uvicorn.Server):
    """uvicorn's server, telling the starting thread when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


class ApiServer:
    """``start()`` listens and returns the base URL; ``stop()`` ends open streams (their requests are aborted)
    and closes the port. One server per instance; make a new one to listen again."""

    def __init__(self, engines: EngineSource, config: ApiConfig | None = None, *, access_log: bool = False,
                 configure_logging: bool = False, graceful_stop_s: float = GRACEFUL_STOP_S,
                 limits: ConnectionLimits | None = None, routes: Routes | None = None,
                 loader: OnDemandModels | None = None, scores: dict[str, dict[str, float]] | None = None) -> None:
        self.config = config or ApiConfig()
        self.app = create_app(engines, self.config, routes, loader, scores)
        self.limits = limits or ConnectionLimits(max_connections=connection_cap())
        self._uvicorn = uvicorn.Config(
            self.app, lifespan="off", loop="asyncio", http=self.limits.protocol(), ws="none", access_log=access_log,
            log_level="info" if access_log else "warning", timeout_graceful_shutdown=graceful_stop_s,
            log_config=uvicorn.config.LOGGING_CONFIG if configure_logging else None)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None
        self._stop_timeout = graceful_stop_s + 3

    @property
    def url(self) -> str:
        """The base URL clients use (``.../v1``)."""
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port or self.config.port}/v1"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> str:
        """Listen (raises :class:`ServerStartError` with the reason) and serve on a new thread; the base URL."""
        if self._server is not None:
            raise RuntimeError("this server has already been started")
        quieten_repeats()
        sock = bind(self.config.host, self.config.port)
        self.port = sock.getsockname()[1]
        self._server = _Server(self._uvicorn)
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="kvasir-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.ready.wait(0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerStartError("the API server stopped while starting (see the log)")
        return self.url

    def _serve(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        finally:
            sock.close()

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C still reaches the caller: the wait wakes twice a second)."""
        while self.running:
            self._thread.join(0.5)

    def stop(self) -> None:
        """Stop listening and end the thread (open streams get ``graceful_stop_s`` to finish, then are cut)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self._stop_timeout)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, or :class:`ServerStartError` saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror:
        raise ServerStartError(f"{host} is not an address this machine can listen on") from None
    sock = socket.socket(family, kind, proto)
    try:
        if os.name == "posix":  # restart at once after a stop; Linux still refuses a second listener
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ServerStartError(_bind_problem(host, port, exc)) from None
    sock.setblocking(False)
    return sock


def _bind_problem(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use (by another server, or another Kvasir); pick another port"
    if exc.errno == errno.EACCES:
        return f"port {port} needs administrator rights on this system; pick a port above 1023"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine"
    return f"could not listen on {host}:{port}: {exc.strerror or exc}"
