"""A small OpenAI-compatible server on a loopback port that misbehaves on request, for the remote client's tests.

``stub.behaviour`` picks what ``POST /v1/chat/completions`` does: stream a reply ("ok"), answer an HTTP error
("status", with ``stub.status`` and ``stub.error_body``), cut the connection after ``stub.pieces`` pieces
("cut"), go silent after them ("stall"), send a malformed event ("malformed"), an error event ("error_event"),
end without a finish reason ("no_finish"), send one line that never ends ("endless_line", until the
client hangs up), or call tools ("tool_call": ``stub.calls``, each streamed in pieces as OpenAI's API streams
them); ``stub.plan`` scripts the next requests one by one. Every
request body is kept in ``stub.requests``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ["Paris", " is", " the", " capital", " of", " France", "."]
PROMETHEUS_LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 300
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 100
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubServer:
    """``with StubServer() as stub:`` serves on ``stub.url`` until the block ends."""

    def __init__(self) -> None:
        self.behaviour = "ok"
        self.plan: list[str] = []  # behaviours for the next POSTs, one each, before ``behaviour`` applies again
        self.status, self.error_body, self.headers = 500, {"error": {"message": "boom"}}, {}
        self.pieces = 3  # pieces sent before "cut", "stall", "malformed" and "error_event" misbehave
        self.stall_s = 5.0
        self.words = list(WORDS)
        self.calls = [{"id": "call_1", "name": "count_letter", "arguments": '{"word": "strawberry", "letter": "r"}'}]
        self.usage = {"prompt_tokens": 40, "completion_tokens": len(WORDS), "total_tokens": 47,
                      "prompt_tokens_details": {"cached_tokens": 32}}
        self.models = [{"id": "stub-model", "object": "model", "owned_by": "stub"}]
        self.models_failures = 0  # the next N GETs of /v1/models answer 503
        self.metrics_text: str | None = PROMETHEUS_LLAMACPP
        self.api_key: str | None = None
        self.requests: list[dict] = []
        self.model_gets = 0
        self.released = threading.Event()  # set on exit: a stalled reply stops waiting
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StubServer:
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="openai-stub", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()


def _handler(stub: StubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def handle(self) -> None:
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):  # the client went away first, as it may
                pass

        def _authorised(self) -> bool:
            if stub.api_key is None or self.headers.get("Authorization") == f"Bearer {stub.api_key}":
                return True
            self._json(401, {"error": {"message": "Invalid API key", "type": "authentication_error"}})
            return False

        def do_GET(self) -> None:
            if self.path == "/metrics" and stub.metrics_text is not None:
                self._send(200, stub.metrics_text.encode(), "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                stub.model_gets += 1
                if not self._authorised():
                    return
                if stub.models_failures > 0:
                    stub.models_failures -= 1
                    self._json(503, {"error": {"message": "loading model"}})
                else:
                    self._json(200, {"object": "list", "data": stub.models})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            stub.requests.append(body)
            if stub.plan:
                stub.behaviour = stub.plan.pop(0)
            if not self._authorised():
                return
            if stub.behaviour == "status":
                self._json(stub.status, stub.error_body, stub.headers)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(body)

        def _stream(self, body: dict) -> None:
            self._event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
            if stub.behaviour == "tool_call":
                self._stream_calls()
                return
            words = stub.words[: body.get("max_tokens", len(stub.words))]
            for i, word in enumerate(words):
                if i == stub.pieces and self._misbehave():
                    return
                self._event({"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]})
            if stub.behaviour != "no_finish":
                reason = "length" if len(words) < len(stub.words) else "stop"
                self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event({"choices": [], "usage": stub.usage})
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")

        def _stream_calls(self) -> None:
            """Each of ``stub.calls`` as OpenAI streams it: id and name first, then the arguments in three pieces."""
            for index, call in enumerate(stub.calls):
                self._call_piece({"index": index, "id": call["id"], "type": "function",
                                  "function": {"name": call["name"], "arguments": ""}})
                arguments, third = call["arguments"], len(call["arguments"]) // 3 + 1
                for start in range(0, len(arguments), third):
                    self._call_piece({"index": index, "function": {"arguments": arguments[start:start + third]}})
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
            self._event({"choices": [], "usage": stub.usage})
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")

        def _call_piece(self, piece: dict) -> None:
            self._event({"choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]})

        def _misbehave(self) -> bool:
            """Do the scripted harm at this point of the stream; True when the stream must end here."""
            if stub.behaviour == "cut":
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)  # no closing chunk: the body is incomplete
                return True
            if stub.behaviour == "stall":
                stub.released.wait(stub.stall_s)
                return True
            if stub.behaviour == "malformed":
                self._chunk(b"data: {\"choices\": [{\"delta\": \n\n")
                self._chunk(b"")
                return True
            if stub.behaviour == "endless_line":
                block = b"x" * 65536
                try:
                    self._chunk(b"data: ")
                    while True:  # as a broken or hostile server would: no newline, ever
                        self._chunk(block)
                except OSError:  # the client refused the line and closed the connection
                    return True
            if stub.behaviour == "error_event":
                self._event({"error": {"message": "the KV cache is full", "code": 503}})
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
                return True
            return False

        def _event(self, data: dict) -> None:
            self._chunk(b"data: " + json.dumps(data).encode() + b"\n\n")
            time.sleep(0.002)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _json(self, status: int, data, headers: dict | None = None) -> None:
            self._send(status, json.dumps(data).encode(), "application/json", headers)

        def _send(self, status: int, payload: bytes, kind: str, headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)

    return Handler
