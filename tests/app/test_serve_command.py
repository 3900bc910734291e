"""``kvasir serve``: the endpoint without a window, started as a user starts it and stopped with Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from app.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
# Runs `kvasir serve ...`, then says whether Qt was imported on the way.
ENTRY = "import sys; from app.__main__ import main; rc = main(sys.argv[1:]); print('qt', 'PySide6' in sys.modules, " \
        "file=sys.stderr); sys.exit(rc)"


def test_another_address_without_a_key_is_refused_before_anything_loads(monkeypatch, capsys):
    monkeypatch.delenv("KVASIR_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "needs an API key" in err and "--api-key" in err


def test_a_port_in_use_is_refused_with_a_clear_message(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", "no-such-model"]) == 1
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_serve_prints_its_url_serves_and_stops_on_ctrl_c_without_qt(tiny_llama, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVASIR_DATA_DIR": str(tmp_path)}  # a library of the default only
    args = ["serve", "--port", "0", "--model", str(tiny_llama), "--device", "cpu", "--kv-blocks", "64"]
    process = subprocess.Popen([sys.executable, "-c", ENTRY, *args], env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        line = process.stdout.readline()
        assert line.startswith("Kvasir serves llama"), (line, process.stderr.read() if process.poll() else "")
        url = line.split(" at ")[-1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with urllib.request.urlopen(f"{url}/models", timeout=30) as response:
            listed = [(m["id"], m["status"]["value"]) for m in json.load(response)["data"]]
            assert listed == [("llama", "loaded"), ("SmolLM2-135M-Instruct", "unloaded")]  # loaded when asked for
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        err = process.stderr.read()
        assert "stopping" in err and "qt False" in err
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.timeout(180)
def test_ctrl_c_with_a_reply_streaming_ends_the_stream_and_the_process(tiny_llama):
    """The engine stops first and ends every open stream, so the server has nothing to wait for; the client sees
    its stream end rather than hang. Waits on the stream and the process (generous guards), never on the clock."""
    import http.client

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["serve", "--port", "0", "--model", str(tiny_llama), "--device", "cpu", "--kv-blocks", "64"]
    process = subprocess.Popen([sys.executable, "-c", ENTRY, *args], env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        url = process.stdout.readline().split(" at ")[-1].strip()
        host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        body = {"model": "llama", "prompt": "Once", "max_tokens": 240, "stream": True}
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
        process.send_signal(signal.SIGINT)
        response.read()  # returns once the server has ended the stream
        assert process.wait(timeout=120) == 0
        assert "stopping (Ctrl-C again to stop at once)" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.timeout(180)
def test_serve_keeps_several_models_resident_and_routes_auto(tiny_model_dirs, tmp_path):
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"rules": [{"model": "qwen2", "has_code": True}], "fallback": "llama"}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["serve", "--port", "0", "--model", str(tiny_model_dirs["llama"]), "--model", str(tiny_model_dirs["qwen2"]),
            "--device", "cpu", "--kv-blocks", "64", "--routes", str(routes)]
    process = subprocess.Popen([sys.executable, "-c", ENTRY, *args], env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        line = process.stdout.readline()
        assert line.startswith("Kvasir serves llama (none, cpu), qwen2 (none, cpu) at "), (
            line, process.stderr.read() if process.poll() else "")
        url = line.split(" at ")[-1].strip()
        with urllib.request.urlopen(f"{url}/models", timeout=30) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["llama", "qwen2", "auto", "SmolLM2-135M-Instruct"]
        body = {"model": "auto", "messages": [{"role": "user", "content": "```\nx = 1\n```"}], "max_tokens": 3}
        request = urllib.request.Request(f"{url}/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.headers["X-Kvasir-Routed-To"] == "qwen2"
            assert json.load(response)["model"] == "qwen2"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize(("extra", "message"), [
    (["--model", "default@int3"], "'int3' is not a quantisation"),
    (["--routes", "no-such-file.json"], "could not read the routes in no-such-file.json"),
])
def test_bad_models_and_routes_are_refused_before_anything_loads(extra, message, capsys):
    assert main(["serve", "--port", "0", *extra]) == 2
    assert message in capsys.readouterr().err
