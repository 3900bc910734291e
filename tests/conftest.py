"""Shared fixtures: the default model's tokenizer and tiny random-weight models of several architectures."""

from __future__ import annotations

import gc
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "KVASIR_CACHE_DIR" not in os.environ:  # converted GGUF copies go to a folder of this test run, removed after it
    import atexit
    import shutil
    import tempfile

    os.environ["KVASIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvasir-test-cache-")
    atexit.register(shutil.rmtree, os.environ["KVASIR_CACHE_DIR"], ignore_errors=True)

import pytest
import torch

from tests.helpers.tiny_models import ARCHITECTURES, write_tiny_model


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def qloop(qapp):
    """An asyncio loop running inside Qt's event loop (qasync), as in the app."""
    import asyncio

    import qasync

    loop = qasync.QEventLoop(qapp, already_running=False)
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)
    # Collect the closed loop here, on the GUI thread: timers that httpx's timeouts left on it can only be
    # unregistered from this thread; collected later on another one (a test server's), Qt would fire them into
    # freed memory.
    gc.collect()


@pytest.fixture
def store(tmp_path):
    from app.data.store import Store

    s = Store(tmp_path / "kvasir.db")
    yield s
    s.close()


@pytest.fixture(autouse=True)
def private_qt_settings(tmp_path_factory):
    """Window geometry and other QSettings go to a temporary folder, never the user's."""
    from PySide6.QtCore import QSettings

    folder = str(tmp_path_factory.mktemp("qsettings"))
    QSettings.setDefaultFormat(QSettings.IniFormat)
    for kind in (QSettings.IniFormat, QSettings.NativeFormat):  # QSettings("Kvasir", "Kvasir") is the native one
        QSettings.setPath(kind, QSettings.UserScope, folder)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """The default model's tokenizer, saved once in Hugging Face format for the tiny models to share."""
    from transformers import AutoTokenizer

    from engine.models.sources import default_model_path

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, tokenizer_dir):
    """One folder per architecture: config.json, safetensors weights and the tokenizer."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: write_tiny_model(arch, root / arch, tokenizer_dir) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def other_tokenizer_model(tmp_path_factory, tokenizer_dir):
    """A tiny llama whose tokenizer has one more token."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("other-tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_tokens(["<kvasir-extra>"])
    changed = tmp_path_factory.mktemp("changed-tokenizer")
    tokenizer.save_pretrained(changed)
    write_tiny_model("llama", folder, changed)
    return folder
