"""``python -m engine generate|chat --remote``: against the loopback stub server, in process."""

import json

import pytest

from engine.tools.cli import main
from tests.helpers.openai_stub import StubServer, free_port


@pytest.fixture
def stub():
    with StubServer() as server:
        yield server


def test_generate_json_reports_the_same_fields_as_the_local_engine(stub, capsys):
    assert main(["generate", "--remote", stub.url, "--max-tokens", "5", "--temperature", "0", "--json", "hi"]) == 0
    out = capsys.readouterr().out.splitlines()
    metrics = json.loads(out[-1])
    assert out[0] == "Paris is the capital of"
    assert {"finish_reason", "error", "ttft_s", "queue_time_s", "prompt_tokens", "cached_prompt_tokens",
            "output_tokens", "decode_tokens_per_s"} <= metrics.keys()
    assert (metrics["finish_reason"], metrics["prompt_tokens"], metrics["cached_prompt_tokens"]) == ("length", 40, 32)
    assert metrics["model"] == "stub-model" and stub.requests[0]["model"] == "stub-model"
    assert stub.requests[0]["max_tokens"] == 5 and stub.requests[0]["temperature"] == 0.0


def test_generate_without_json_ends_with_the_metrics_line(stub, capsys):
    assert main(["generate", "--remote", stub.url, "--model", "other", "--system", "Be brief.", "hi"]) == 0
    captured = capsys.readouterr()
    assert "7 tokens" in captured.err and "32/40 prompt tokens from cache" in captured.err
    assert stub.requests[0]["model"] == "other" and stub.requests[0]["messages"][0]["role"] == "system"


def test_the_api_key_comes_from_the_flag_or_the_environment(stub, capsys, monkeypatch):
    stub.api_key = "sk-1"
    assert main(["generate", "--remote", stub.url, "--api-key", "sk-1", "hi"]) == 0
    monkeypatch.setenv("KVASIR_API_KEY", "sk-1")
    assert main(["generate", "--remote", stub.url, "hi"]) == 0
    monkeypatch.setenv("KVASIR_API_KEY", "sk-2")
    assert main(["generate", "--remote", stub.url, "hi"]) == 2
    assert "HTTP 401" in capsys.readouterr().err


def test_several_models_and_no_model_flag_is_an_error_naming_them(stub, capsys):
    stub.models = [{"id": "a"}, {"id": "b"}]
    assert main(["generate", "--remote", stub.url, "hi"]) == 2
    assert "serves 2 models; pick one with --model: a, b" in capsys.readouterr().err and not stub.requests


def test_a_reply_cut_off_keeps_its_text_and_exits_1_with_the_reason(stub, capsys):
    stub.behaviour, stub.pieces = "cut", 2
    assert main(["generate", "--remote", stub.url, "--model", "m", "--json", "hi"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("Paris is\n")
    assert json.loads(captured.out.splitlines()[-1])["finish_reason"] == "error"
    assert "closed the connection mid-reply" in captured.err


def test_an_unreachable_server_is_a_clear_error(capsys):
    assert main(["generate", "--remote", f"http://127.0.0.1:{free_port()}", "--model", "m", "hi"]) == 1
    assert "could not connect" in capsys.readouterr().err
    assert main(["generate", "--remote", "localhost:8000", "hi"]) == 2
    assert "start it with http" in capsys.readouterr().err


def test_chat_keeps_the_conversation_and_drops_a_failed_turn(stub, capsys, monkeypatch):
    lines = iter(["first", "second", "third", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    stub.plan = ["ok", "status", "ok"]  # the second turn fails with a 500
    assert main(["chat", "--remote", stub.url, "--quant", "int8"]) == 0
    out = capsys.readouterr()
    assert "stub-model on" in out.out and "[error: the server failed (HTTP 500): boom]" in out.out
    assert out.out.count("prompt tokens from cache") == 2 and "--quant apply to the local engine" in out.err
    third = stub.requests[2]["messages"]
    assert [m["content"] for m in third] == ["first", "Paris is the capital of France.", "third"]
