"""The endpoint against clients that never finish a request: a header deadline, a connection cap, one log line."""

from __future__ import annotations

import http.client
import json
import logging
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine import ApiConfig, ApiServer, AsyncEngine, EngineConfig
from engine.api.connections import ConnectionLimits
from engine.api.log_once import RepeatFilter

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
HALF_A_REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-"


@pytest.fixture(scope="module")
def engine(tiny_llama):
    engine = AsyncEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, max_model_len=256))
    yield engine
    engine.shutdown()


@pytest.fixture
def serve(engine):
    servers = []

    def start(limits: ConnectionLimits) -> ApiServer:
        server = ApiServer(lambda: engine, ApiConfig(port=0), limits=limits)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


def half_sent(server: ApiServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(HALF_A_REQUEST)
    return sock


def models(server: ApiServer) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/v1/models")
    status = connection.getresponse().status
    connection.close()
    return status


def test_a_connection_that_never_finishes_its_headers_is_closed_at_the_deadline(serve):
    server = serve(ConnectionLimits(header_timeout_s=0.5))
    sock = half_sent(server)
    assert sock.recv(1024) == b""  # closed by the server: recv sees the end, not the 60 s socket timeout
    sock.close()
    assert models(server) == 200


def test_a_slow_client_that_does_send_its_headers_is_served(serve):
    server = serve(ConnectionLimits(header_timeout_s=5.0))
    sock = half_sent(server)
    sock.sendall(b"Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    reply = sock.recv(65536)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 400")  # the endpoint's own answer (no messages), not a dropped line


def test_past_the_cap_a_new_connection_gets_a_503_and_the_endpoint_serves_again_once_they_go(serve):
    server = serve(ConnectionLimits(header_timeout_s=1.0, max_connections=8))
    held = [half_sent(server) for _ in range(8)]
    extra = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    reply = b""
    while chunk := extra.recv(65536):
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503")
    assert json.loads(body)["error"]["code"] == "too_many_connections"
    extra.close()
    for sock in held:  # the server closes them at the deadline, and forgets each before its client sees the end
        assert sock.recv(1024) == b""
        sock.close()
    assert models(server) == 200


def cap_under(soft: int, hard: str) -> list[int]:
    """connection_cap(1024), and the soft open-file limit after it, in a process started with these limits."""
    script = ("import resource; from engine.api.connections import connection_cap; "
              f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
              "print(connection_cap(1024), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
                          cwd=ROOT)
    return [int(n) for n in done.stdout.split()]


def test_the_cap_keeps_files_to_spare_under_the_open_file_limit():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert cap_under(300, "300") == [300 - 128, 300]
    raised = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    assert cap_under(300, "resource.getrlimit(resource.RLIMIT_NOFILE)[1]") == [min(1024, raised - 128), raised]


def test_a_burst_of_one_log_line_is_written_once_then_counted():
    now = [0.0]
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("test.repeats")
    logger.addHandler(handler)
    logger.addFilter(RepeatFilter(window_s=60, clock=lambda: now[0]))
    logger.propagate = False
    for fd in range(1000):
        logger.error("socket.accept() out of system resource\nsocket: fd=%d", fd)
    logger.error("another problem")
    now[0] = 61.0
    logger.error("socket.accept() out of system resource\nsocket: fd=%d", 5)
    assert [r.getMessage().split("\n")[0] for r in records] == [
        "socket.accept() out of system resource", "another problem",
        "socket.accept() out of system resource"]
    assert "(and 999 more like it in the last 60 s, not written)" in records[-1].getMessage()
