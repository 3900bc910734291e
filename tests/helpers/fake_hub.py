"""A small Hugging Face Hub on loopback: the API endpoints huggingface_hub calls, for repositories held in memory.

It answers ``/api/models`` (search), ``/api/models/{repo}`` and ``.../revision/{rev}`` (a repository with its
files' sizes and LFS hashes), and ``/{repo}/resolve/{rev}/{file}`` (HEAD and GET, with ETag, X-Repo-Commit,
X-Linked-Size and Range), the way the Hub does, so the real client code runs against it. Every request is
logged with its Range header; a file can be throttled (to cancel a download halfway) and any path can be
made to fail with a status code.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

GGUF_REPO = "tiny-org/tiny-llama-GGUF"
HF_REPO = "tiny-org/tiny-llama"


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    tags: list[str] = field(default_factory=lambda: ["text-generation", "conversational"])
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-01-02T03:04:05.000Z"
    pipeline_tag: str = "text-generation"
    gated: bool = False
    parameters: dict[str, int] | None = None  # the "safetensors" summary: {"F32": n}
    sha: str = ""

    def __post_init__(self) -> None:
        if not self.sha:
            self.sha = hashlib.sha1(self.repo_id.encode()).hexdigest()


@dataclass
class Logged:
    method: str
    path: str
    range: str | None


class FakeHub:
    """``with FakeHub(repos) as hub: ... hub.url``; ``hub.log`` holds the requests."""

    def __init__(self, repos: list[FakeRepo]) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.log: list[Logged] = []
        self.fail: dict[str, int] = {}  # path prefix -> status to answer with
        self.throttle: dict[str, float] = {}  # file name -> bytes per second
        self.sent: dict[str, int] = {}  # file name -> bytes of it sent in GET bodies
        self.ignore_range = False  # answer every GET with the whole file, as some proxies do
        self.delay: dict[str, float] = {}  # path prefix -> seconds to wait before answering
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def ranges(self, name: str) -> list[str | None]:
        """The Range headers of the GET requests for file ``name``."""
        return [e.range for e in self.log if e.method == "GET" and "/resolve/" in e.path and e.path.endswith(name)]

    # -- answers -----------------------------------------------------------------------------------------

    def search(self, query: dict) -> list[dict]:
        text = query.get("search", [""])[0].lower()
        wanted = query.get("filter", [])
        pipeline = query.get("pipeline_tag", [None])[0]
        found = [r for r in self.repos.values() if text in r.repo_id.lower()
                 and all(t in r.tags for t in wanted) and (pipeline is None or r.pipeline_tag == pipeline)]
        found.sort(key=lambda r: r.downloads, reverse=True)
        limit = int(query.get("limit", ["1000"])[0])
        return [self.summary(r) for r in found[:limit]]

    def summary(self, repo: FakeRepo) -> dict:
        return {"id": repo.repo_id, "_id": repo.sha[:24], "modelId": repo.repo_id, "downloads": repo.downloads,
                "likes": repo.likes, "lastModified": repo.last_modified, "tags": repo.tags,
                "pipeline_tag": repo.pipeline_tag, "gated": repo.gated, "private": False}

    def details(self, repo: FakeRepo) -> dict:
        siblings = []
        for name, data in repo.files.items():
            entry = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
            if _is_lfs(name):
                entry["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            siblings.append(entry)
        info = {**self.summary(repo), "sha": repo.sha, "siblings": siblings, "author": repo.repo_id.split("/")[0],
                "cardData": {"license": "apache-2.0"}, "createdAt": repo.last_modified}
        if repo.parameters:
            info["safetensors"] = {"parameters": repo.parameters, "total": sum(repo.parameters.values())}
        return info


def _is_lfs(name: str) -> bool:
    return name.endswith((".gguf", ".safetensors", ".bin"))


REPO_PATH = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")
RESOLVE_PATH = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            hub.log.append(Logged(self.command, path, self.headers.get("Range")))
            for prefix, seconds in hub.delay.items():
                if path.startswith(prefix):
                    time.sleep(seconds)
            for prefix, status in hub.fail.items():
                if path.startswith(prefix):
                    return self._json({"error": f"scripted failure {status}"}, status, body)
            if path == "/api/models":
                return self._json(hub.search(parse_qs(parts.query)), 200, body)
            if m := REPO_PATH.match(path):
                repo = hub.repos.get(m["repo"])
                if repo is None or (m["rev"] not in (None, "main", repo.sha)):
                    return self._not_found("RepoNotFound" if repo is None else "RevisionNotFound", body)
                return self._json(hub.details(repo), 200, body)
            if m := RESOLVE_PATH.match(path):
                return self._file(m["repo"], m["rev"], m["file"], body)
            self._not_found("RepoNotFound", body)

        def _json(self, data, status: int, body: bool) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if body:
                self.wfile.write(raw)

        def _not_found(self, code: str, body: bool) -> None:
            self._refuse(404, code, code, body)

        def _refuse(self, status: int, code: str, message: str, body: bool) -> None:
            raw = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if body:
                self.wfile.write(raw)

        def _file(self, repo_id: str, rev: str, name: str, body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None or rev not in ("main", repo.sha):
                return self._not_found("RepoNotFound" if repo is None else "RevisionNotFound", body)
            if name not in repo.files:
                return self._not_found("EntryNotFound", body)
            if repo.gated:  # the Hub's answer to a download without accepted conditions
                return self._refuse(403, "GatedRepo", f"Access to model {repo_id} is restricted.", body)
            data = repo.files[name]
            start, end, status = 0, len(data), 200
            asked = None if hub.ignore_range else self.headers.get("Range")
            if asked and (m := re.match(r"bytes=(\d+)-(\d*)$", asked)):
                start = int(m[1])
                end = min(int(m[2]) + 1, len(data)) if m[2] else len(data)
                status = 206
            etag = hashlib.sha256(data).hexdigest() if _is_lfs(name) else hashlib.sha1(data).hexdigest()
            self.send_response(status)
            self.send_header("ETag", f'"{etag}"')
            self.send_header("X-Repo-Commit", repo.sha)
            self.send_header("Accept-Ranges", "bytes")
            if _is_lfs(name):
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("X-Linked-ETag", f'"{etag}"')
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            if body:
                self._send(name, data[start:end])

        def _send(self, name: str, data: bytes) -> None:
            rate = hub.throttle.get(name)
            step = 16 * 1024 if rate else 1024 * 1024
            try:
                for i in range(0, len(data), step):
                    self.wfile.write(data[i : i + step])
                    hub.sent[name] = hub.sent.get(name, 0) + len(data[i : i + step])
                    if rate:
                        self.wfile.flush()
                        time.sleep(step / rate)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (a cancelled download)

    return Handler


def tiny_ggufs(tiny_llama: Path, folder: Path) -> dict[str, bytes]:
    """Two real GGUF files of the tiny llama, as a GGUF repository holds them: Q4_1 and Q8_0."""
    from tests.helpers.tiny_gguf import write_tiny_llama_gguf

    files = {}
    for name, linear in (("tiny-llama-Q4_1.gguf", "Q4_1"), ("tiny-llama-Q8_0.gguf", "Q8_0")):
        files[name] = write_tiny_llama_gguf(tiny_llama, folder / name, linear_type=linear,
                                            embedding_type="Q8_0").read_bytes()
    return files


def tiny_repos(ggufs: dict[str, bytes], tiny_llama: Path) -> list[FakeRepo]:
    """A GGUF repository (two usable files, a split one, a vision projector), a safetensors one, and two
    that a chat search must leave out (ONNX weights only; not a text-generation model)."""
    gguf_files = {**ggufs, "mmproj-tiny-f16.gguf": b"GGUF" + bytes(64),
                  "big/tiny-llama-Q4_K_M-00001-of-00002.gguf": bytes(1000),
                  "big/tiny-llama-Q4_K_M-00002-of-00002.gguf": bytes(500), "README.md": b"---\nlicense: mit\n---\n"}
    hf_files = {f.name: f.read_bytes() for f in tiny_llama.iterdir() if f.is_file()}
    return [
        FakeRepo(GGUF_REPO, gguf_files, tags=["gguf", "text-generation", "conversational"], downloads=500, likes=7),
        FakeRepo(HF_REPO, hf_files, tags=["safetensors", "llama", "text-generation"], downloads=900, likes=3,
                 parameters={"F32": 6_500_000}),
        FakeRepo("tiny-org/tiny-llama-onnx", {"model.onnx": b"x"}, tags=["onnx", "text-generation"], downloads=5000),
        FakeRepo("tiny-org/tiny-llama-embedder", {"model.safetensors": b"x"}, tags=["safetensors"],
                 pipeline_tag="feature-extraction", downloads=10_000),
    ]
