"""The top bar shows what serves: it returns there after a failed or refused switch, asks before stopping
replies, and the next start opens on the model that served last."""

import asyncio

from app.__main__ import parse_args, starting_config
from app.data.settings import Settings
from engine import EngineConfig


def test_a_successful_load_is_remembered_for_the_next_start(window, tmp_path):
    bar = window.model_bar
    window.bridge.start(EngineConfig(model="default", quantization="w8"))
    assert bar.serving == ("default", "w8") and bar.quant_box.currentText() == "w8"
    saved = Settings(window.settings.path)
    assert (saved["model"], saved["quantization"], saved["device"]) == ("default", "w8", "auto")
    config = starting_config(parse_args([]), saved)
    assert (config.model, config.quantization) == ("default", "w8")
    given = starting_config(parse_args(["--quant", "none"]), saved)
    assert (given.model, given.quantization) == ("default", "none")  # the command line wins
    assert starting_config(parse_args(["--self-test"]), saved).quantization == "auto"


def test_after_a_failed_switch_the_pickers_show_the_model_that_still_serves(window):
    bar = window.model_bar
    window.bridge.start(EngineConfig(model="default", quantization="none"))
    bar.quant_box.setCurrentText("nf4")  # the user picks nf4; the load fails; "none" still serves
    window.bridge.fail_load_keeping_the_model("nf4 needs bitsandbytes")
    assert bar.quant_box.currentText() == "none" and not bar.progress.isVisible()
    assert "Could not load the model: nf4 needs bitsandbytes" in window.statusBar().currentMessage()


def test_another_model_loads_beside_while_a_reply_streams_without_stopping_it(window, qloop, monkeypatch):
    window.bridge.start(EngineConfig(model="default", quantization="none"))
    window.bridge.gate = asyncio.Event()  # hold the reply mid-way
    reply = window.send("Tell me about Paris")
    qloop.run_until_complete(asyncio.sleep(0.01))
    asked, shown = [], []
    monkeypatch.setattr(window.switcher, "confirm", lambda writing: asked.append(writing) or False)
    monkeypatch.setattr(window.bridge, "show", lambda config: shown.append(config) or asyncio.sleep(0))
    qloop.run_until_complete(window.switcher.switch(EngineConfig(model="default", quantization="int4")))
    assert asked == [] and [c.quantization for c in shown] == ["int4"]  # nothing to stop: no question
    assert window.conversations.get(window.current).settings["local_model"] == {"model": "default",
                                                                                "quantization": "int4"}
    assert window.controller.is_generating(window.current)
    window.bridge.gate.set()
    assert qloop.run_until_complete(reply).status == "complete"


def test_a_model_that_needs_room_asks_before_unloading_the_least_recently_used(window, qloop, monkeypatch):
    window.bridge.start(EngineConfig(model="default", quantization="none"))
    asked, unloaded, shown = [], [], []
    monkeypatch.setattr(window.bridge, "room_for", lambda config: ["Old-model"])
    monkeypatch.setattr(window.bridge, "unload", lambda model: unloaded.append(model) or asyncio.sleep(0))
    monkeypatch.setattr(window.bridge, "show", lambda config: shown.append(config) or asyncio.sleep(0))
    monkeypatch.setattr(window.switcher, "confirm_unload", lambda models, config: asked.append(models) or False)
    assert window.switcher.switch(EngineConfig(model="default", quantization="int4")) is None
    assert asked == [["Old-model"]] and unloaded == shown == []  # declined: nothing unloaded, nothing loaded
    monkeypatch.setattr(window.switcher, "confirm_unload", lambda models, config: True)
    qloop.run_until_complete(window.switcher.switch(EngineConfig(model="default", quantization="int4")))
    assert unloaded == ["Old-model"] and [c.quantization for c in shown] == ["int4"]


def test_reloading_the_model_on_screen_while_a_reply_streams_asks_first(window, qloop, monkeypatch):
    window.bridge.start(EngineConfig(model="default", quantization="none"))
    window.bridge.gate = asyncio.Event()  # hold the reply mid-way
    reply = window.send("Tell me about Paris")
    qloop.run_until_complete(asyncio.sleep(0.01))
    asked, switched = [], []
    monkeypatch.setattr(window.switcher, "confirm", lambda writing: asked.append(writing) or False)
    monkeypatch.setattr(window.bridge, "switch", lambda config: switched.append(config) or asyncio.sleep(0))
    other_format = EngineConfig(model="default", quantization="none", kv_cache_dtype="q8_0")
    assert window.switcher.show(other_format) is None
    assert asked == [1] and switched == []
    assert window.controller.is_generating(window.current)  # declined: the reply goes on
    monkeypatch.setattr(window.switcher, "confirm", lambda writing: True)
    qloop.run_until_complete(window.switcher.show(other_format))
    assert [c.kv_cache_dtype for c in switched] == ["q8_0"]
    window.bridge.gate.set()
    qloop.run_until_complete(reply)
