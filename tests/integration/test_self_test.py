"""``kvasir --self-test``, run as a user or a packaged binary would run it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_self_test_streams_a_reply_and_prints_its_metrics(tmp_path):
    kvasir = Path(sys.executable).with_name("kvasir")
    command = [str(kvasir)] if kvasir.exists() else [sys.executable, "-m", "app"]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "KVASIR_CONFIG_DIR": str(tmp_path)}
    proc = subprocess.run([*command, "--self-test", "--data-dir", str(tmp_path / "data")], capture_output=True,
                          text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["tokens"] > 0 and report["ttft_s"] > 0 and report["tokens_per_s"] > 0
    assert "Paris" in report["reply"]
    assert report["ready_s"] >= report["load_s"] > 0  # from the process's start, which came before the wait
    assert (tmp_path / "data" / "kvasir.db").is_file()


def test_self_test_fails_in_words_when_the_model_cannot_load(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "KVASIR_CONFIG_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "app", "--self-test", "--model", str(tmp_path / "missing.gguf"),
                           "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 1 and "the model did not load" in proc.stderr and "no model at" in proc.stderr
