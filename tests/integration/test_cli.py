"""The command line, run as a user would."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def run_cli(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "engine", *args], input=stdin, capture_output=True, text=True, timeout=600
    )


def test_generate_streams_and_reports_metrics():
    proc = run_cli("generate", "--device", "cpu", "--max-tokens", "12", "--temperature", "0", "--json",
                   "What is the capital of Germany?")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    metrics = json.loads(lines[-1])
    assert "Berlin" in "\n".join(lines[:-1])
    assert metrics["output_tokens"] > 0 and metrics["ttft_s"] > 0 and metrics["prompt_tokens"] > 10


def test_chat_keeps_the_conversation_and_reuses_the_cache():
    proc = run_cli("chat", "--device", "cpu", "--max-tokens", "24", "--temperature", "0",
                   stdin="Tell me about Paris.\nAnd about Rome?\n\n")
    assert proc.returncode == 0, proc.stderr
    reports = [line for line in proc.stdout.splitlines() if "prompt tokens from cache" in line]
    assert len(reports) == 2
    cached, total = reports[1].split("|")[-1].split()[0].split("/")
    assert int(cached) >= 0.5 * int(total)


def test_bad_model_path_is_a_clear_error():
    proc = run_cli("generate", "--model", "/no/such/file.gguf", "hello")
    assert proc.returncode == 2 and "no model at" in proc.stderr
