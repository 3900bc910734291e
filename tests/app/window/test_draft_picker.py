"""The model bar's draft picker: the models that can draft for the one serving, each with its memory; picking one
reloads the model with it beside, and it is remembered for that model and quantisation."""

import asyncio

from app.__main__ import parse_args, starting_config
from app.data.settings import Settings
from app.window.draft_picker import NO_DRAFT, NONE_OFFERED, candidate_text
from engine import EngineConfig
from engine.models.draft_candidates import draft_candidates


def _offered(qtbot, bar) -> list[str]:
    qtbot.waitUntil(lambda: not bar.draft_box.checking(), timeout=120_000)  # read on a worker thread
    return [bar.draft_box.itemText(i) for i in range(bar.draft_box.count())]


def test_a_float_model_is_offered_its_int4_copy_and_picking_it_reloads_with_it_beside(window, qtbot, qloop):
    bar, bridge = window.model_bar, window.bridge
    bridge.start(EngineConfig(model="default", quantization="none"))
    (own,) = draft_candidates("default", "none", ["default"])
    assert _offered(qtbot, bar) == [NO_DRAFT, candidate_text(own, "default")]
    assert "(itself) · " in bar.draft_box.itemText(1) and "MiB" in bar.draft_box.itemText(1)
    assert bar.draft_box.currentText() == NO_DRAFT and bar.draft_box.isEnabled()

    bar.draft_box.setCurrentIndex(1)
    bar.draft_box.activated.emit(1)
    qloop.run_until_complete(asyncio.sleep(0))  # the switch's task runs
    config = bridge.config
    assert (config.model, config.quantization, config.draft_model, config.draft_quantization) == \
        ("default", "none", "default", "int4")
    saved = Settings(window.settings.path)
    assert saved["drafts"] == {"default@none": "default"}
    assert starting_config(parse_args([]), saved).draft_model == "default"  # the next start loads it too
    _offered(qtbot, bar)
    assert bar.draft_box.currentData() == "default"

    bar.draft_box.setCurrentIndex(0)
    bar.draft_box.activated.emit(0)
    qloop.run_until_complete(asyncio.sleep(0))
    assert bridge.config.draft_model is None and bridge.config.quantization == "none"
    assert Settings(window.settings.path)["drafts"] == {}


def test_a_model_at_4_bits_is_offered_no_draft(window, qtbot):
    bar = window.model_bar
    window.bridge.start(EngineConfig(model="default", quantization="int4"))
    assert _offered(qtbot, bar) == [NO_DRAFT]
    assert not bar.draft_box.isEnabled() and bar.draft_box.toolTip().startswith(NONE_OFFERED)


def test_a_switch_called_off_shows_the_draft_that_still_serves(window, qtbot, monkeypatch):
    bar, bridge = window.model_bar, window.bridge
    bridge.start(EngineConfig(model="default", quantization="none", draft_model="default"))
    _offered(qtbot, bar)
    assert bar.draft_box.currentData() == "default"
    monkeypatch.setattr(window.switcher, "reload", lambda config: bar.show_serving())  # the user says no
    bar.draft_box.setCurrentIndex(0)
    bar.draft_box.activated.emit(0)
    assert bar.draft_box.currentData() == "default" and bridge.config.draft_model == "default"
