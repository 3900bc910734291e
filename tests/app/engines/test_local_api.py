"""The local API in the app: a Preferences switch, the status bar, and serving whatever engine the bridge holds."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import urllib.error
import urllib.request

import openai
import pytest

from app.data.settings import DEFAULTS, Settings, load_presets
from app.dialogs.preferences import PreferencesDialog
from engine import EngineConfig, RequestSnapshot
from engine.serving.async_engine import UnknownModel
from tests.helpers.fake_engine import fake_stats


class ServingEngine:
    """What the endpoint asks of an engine to list its model: a stand-in for the bridge's AsyncEngine."""

    def __init__(self, model_name: str) -> None:
        self.alive, self.failure = True, None
        self._stats = fake_stats(model_name=model_name)

    def stats(self, model=None):
        return self._stats

    def model_ids(self) -> list[str]:
        return [self._stats.model_name]

    def model_id(self, model=None) -> str:
        if model not in (None, self._stats.model_name):
            raise UnknownModel(model, self.model_ids())
        return self._stats.model_name


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def served_models(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/models", timeout=10) as response:
        return [m["id"] for m in json.load(response)["data"]]


def answer_preferences(monkeypatch, **api) -> None:
    """Preferences opens, the user sets the local API fields to ``api`` and presses OK."""
    def exec_(dialog: PreferencesDialog) -> bool:
        dialog.api.enabled.setChecked(api.get("enabled", True))
        dialog.api.host.setText(api.get("host", "127.0.0.1"))
        dialog.api.port.setValue(api["port"])
        dialog.api.api_key.setText(api.get("api_key", ""))
        dialog.accept()
        return dialog.result() == PreferencesDialog.Accepted

    monkeypatch.setattr(PreferencesDialog, "exec", exec_)


def test_the_api_is_off_by_default(window):
    assert DEFAULTS["api"]["enabled"] is False and window.local_api.url is None
    assert window.api_label.isHidden()


def test_turning_it_on_serves_the_bridges_engine_and_follows_it(window, monkeypatch):
    window.bridge.engine = ServingEngine("First-Model")
    port = free_port()
    answer_preferences(monkeypatch, port=port)
    window.edit_preferences()
    url = f"http://127.0.0.1:{port}/v1"
    assert window.local_api.url == url and window.settings["api"]["enabled"] is True
    assert window.api_label.isVisible() and url in window.api_label.text()
    assert served_models(url) == ["First-Model"]
    window.bridge.engine = ServingEngine("Switched-Model")  # a model switch, or an engine restarted
    assert served_models(url) == ["Switched-Model"]
    answer_preferences(monkeypatch, enabled=False, port=port)
    window.edit_preferences()
    assert window.local_api.url is None and window.api_label.isHidden()
    with pytest.raises(urllib.error.URLError):
        served_models(url)


def test_a_port_in_use_is_said_plainly_and_nothing_crashes(window, monkeypatch):
    warnings = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda parent, title, text: warnings.append(text))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        answer_preferences(monkeypatch, port=port)
        window.edit_preferences()
    assert len(warnings) == 1 and f"port {port} on 127.0.0.1 is already in use" in warnings[0]
    assert window.local_api.url is None and "Local API off: port" in window.api_label.text()


def test_another_address_needs_a_key_before_preferences_close(qtbot, monkeypatch):
    warnings = []
    monkeypatch.setattr("app.dialogs.preferences.QMessageBox.warning",
                        lambda parent, title, text: warnings.append(text))
    dialog = PreferencesDialog(load_presets(), json.loads(json.dumps(DEFAULTS)))
    qtbot.addWidget(dialog)
    assert not dialog.api.host.isEnabled() and dialog.api.status.text() == "Off"  # off: its fields wait
    dialog.api.enabled.setChecked(True)
    dialog.api.host.setText("0.0.0.0")
    dialog.accept()
    assert dialog.result() != PreferencesDialog.Accepted and "needs an API key" in warnings[0]
    dialog.api.generate.click()
    key = dialog.api.api_key.text()
    assert len(key) >= 24
    dialog.accept()
    assert dialog.result() == PreferencesDialog.Accepted
    assert dialog.result_values()["api"] == {"enabled": True, "host": "0.0.0.0", "port": DEFAULTS["api"]["port"],
                                             "api_key": key}


def test_api_settings_are_saved_and_bad_values_fall_back(tmp_path):
    path = tmp_path / "settings.json"
    settings = Settings(path)
    settings["api"] = {"enabled": True, "host": "127.0.0.1", "port": 9123, "api_key": "k"}
    settings.save()
    assert Settings(path)["api"] == {"enabled": True, "host": "127.0.0.1", "port": 9123, "api_key": "k"}
    path.write_text(json.dumps({"api": {"enabled": "yes", "port": 70000, "host": "localhost"}}))
    assert Settings(path)["api"] == {**DEFAULTS["api"], "host": "localhost"}


def test_the_panel_names_api_requests(qtbot):
    from app.panel.engine_panel import EnginePanel

    panel = EnginePanel()
    qtbot.addWidget(panel)
    request = RequestSnapshot(request_id="areq-7", running=True, prompt_tokens=40, cached_prompt_tokens=32,
                              output_tokens=5, queue_time_s=None, decode_tokens_per_s=20.0, blocks=3,
                              exclusive_blocks=1, source="api")
    panel.update_stats(fake_stats(requests=(request,)))
    title = panel.requests.data(panel.requests.index(0, 0))
    assert title == "API · areq-7"


def test_on_the_real_engine_window_and_api_share_it_and_serve_a_model_loaded_beside(qtbot, qloop, store, tmp_path,
                                                                                   monkeypatch, tiny_model_dirs):
    from app.chats.session import ChatSession
    from app.engines.bridge import EngineBridge
    from app.window.main_window import MainWindow

    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    bridge = EngineBridge()
    window = MainWindow(ChatSession(store, bridge))
    qtbot.addWidget(window)
    settings = store.conversation(window.current).settings
    store.update_conversation(window.current, settings={**settings, "temperature": 0.0, "max_tokens": 8})
    try:
        with qtbot.wait_signal(bridge.loaded, timeout=120_000):
            bridge.start(EngineConfig(model=str(tiny_model_dirs["llama"]), device="cpu", num_kv_blocks=64))
        answer_preferences(monkeypatch, port=free_port())
        window.edit_preferences()
        client = openai.OpenAI(base_url=window.local_api.url, api_key="unused", max_retries=0, timeout=60)
        ask = functools.partial(client.chat.completions.create, model="llama", max_tokens=6,
                                messages=[{"role": "user", "content": "hi"}], extra_body={"ignore_eos": True})
        both = asyncio.gather(window.send("hello"), qloop.run_in_executor(None, ask))
        message, reply = qloop.run_until_complete(both)
        assert message.status == "complete" and reply.usage.completion_tokens == 6
        qloop.run_until_complete(window.switcher.switch(EngineConfig(model=str(tiny_model_dirs["qwen2"]), device="cpu",
                                                                  num_kv_blocks=64)))
        assert served_models(window.local_api.url) == ["llama", "qwen2", "auto"]  # loaded beside the first
        assert bridge.focused == "qwen2" and bridge.config.model == str(tiny_model_dirs["qwen2"])
        assert client.chat.completions.create(**{**ask.keywords, "model": "qwen2"}).model == "qwen2"
    finally:
        window.close()
        bridge.shutdown()
