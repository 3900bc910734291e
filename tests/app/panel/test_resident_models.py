"""The panel with several resident models: a row per model (memory, requests, speed, KV), the memory bar
counting the others, and picking a row to see that model's numbers while the chats keep theirs."""

import dataclasses

from app.panel.memory_bar import MemoryParts
from app.panel.resident_models import ResidentModels
from app.window.engine_panels import EnginePanels
from tests.helpers.fake_engine import FakeBridge, fake_stats

MiB = 1024**2


def small():
    return fake_stats(model_name="SmolLM2", quantization="int4", model_memory_bytes=100 * MiB,
                      kv_touched_bytes=20 * MiB, num_running=1, num_waiting=0, decode_tokens_per_s=210.0,
                      kv_usage=0.25, process_resident_bytes=900 * MiB)


def large():
    return fake_stats(model_name="SmolLM2 full", quantization="none", model_memory_bytes=500 * MiB,
                      kv_touched_bytes=40 * MiB, num_running=0, num_waiting=2, decode_tokens_per_s=0.0,
                      kv_usage=0.5, process_resident_bytes=900 * MiB)


def cells(models, index):
    """A model's id (its title row) and numbers (the row under it)."""
    table = models.table
    return [table.item(2 * index, 0).text(), *(table.item(2 * index + 1, c).text() for c in range(table.columnCount()))]


def test_the_list_shows_from_two_models_each_with_its_memory_requests_and_speed(qtbot):
    models = ResidentModels()
    qtbot.addWidget(models)
    models.update_models({"default": small()}, "default")
    assert models.isHidden()  # one model: the rest of the panel says it all
    models.update_models({"default": small(), "default@none": large()}, "default")
    assert not models.isHidden()
    assert cells(models, 0) == ["default", "120 MiB", "1 / 0", "210.0", "25%"]
    assert cells(models, 1) == ["default@none", "540 MiB", "0 / 2", "–", "50%"]
    assert models.table.item(0, 0).font().bold() and not models.table.item(2, 0).font().bold()
    assert models.others_bytes() == 540 * MiB and "660.0 MiB between them" in models.total.text()
    with qtbot.waitSignal(models.model_chosen) as chosen:
        models.table.cellClicked.emit(3, 2)  # the second model's numbers
    assert chosen.args == ["default@none"]
    with qtbot.waitSignal(models.model_chosen) as chosen:
        models.table.cellClicked.emit(0, 0)  # the first one's title
    assert chosen.args == ["default"]


def test_the_memory_bar_counts_the_other_models_apart_from_the_runtime():
    parts = MemoryParts.of(small(), others=540 * MiB)
    assert (parts.weights, parts.kv, parts.others) == (100 * MiB, 20 * MiB, 540 * MiB)
    assert parts.runtime == (900 - 100 - 20 - 540) * MiB
    assert "other models 540.0 MiB" in parts.summary()
    assert MemoryParts.of(small()).runtime == 780 * MiB  # one model: nothing else to count


class TwoModels(FakeBridge):
    """Two resident models, 'default' on screen."""

    focused = "default"

    def __init__(self):
        super().__init__()
        self.every = {"default": small(), "default@none": large()}

    def stats(self, model=None):
        return self.every[model or self.focused]

    def all_stats(self):
        return dict(self.every)


def test_picking_a_model_shows_its_numbers_until_the_chat_on_screen_changes_model(qtbot, store):
    from app.chats.session import ChatSession

    bridge = TwoModels()
    panels = EnginePanels(ChatSession(store, bridge))
    qtbot.addWidget(panels)
    panels.show()
    label = panels.panel.labels
    bridge.models_updated.emit(bridge.all_stats())
    bridge.stats_updated.emit(bridge.stats())
    assert label["Model"].text() == "SmolLM2" and panels.shown_model() == "default"
    assert "other models 540.0 MiB" in label["Memory"].text()
    panels.panel.models.table.cellClicked.emit(2, 0)
    assert panels.shown_model() == "default@none" and label["Model"].text() == "SmolLM2 full"
    assert label["Requests"].text() == "0 running, 2 waiting" and "other models 120.0 MiB" in label["Memory"].text()
    panels.panel.models.table.cellClicked.emit(0, 0)  # back to the model on screen
    assert panels.shown_model() == "default" and label["Model"].text() == "SmolLM2"
    panels.panel.models.table.cellClicked.emit(2, 0)
    bridge.every["default@none"] = dataclasses.replace(large(), num_running=2, num_waiting=0)
    bridge.models_updated.emit(bridge.all_stats())
    bridge.stats_updated.emit(bridge.stats())  # the focused model's tick does not take the panel back
    assert label["Model"].text() == "SmolLM2 full" and label["Requests"].text() == "2 running, 0 waiting"
    bridge.loaded.emit(bridge.stats("default"))  # a chat on another model came on screen
    assert panels.shown_model() == "default" and label["Model"].text() == "SmolLM2"
    panels.panel.models.table.cellClicked.emit(2, 0)
    del bridge.every["default@none"]  # unloaded (idle)
    bridge.models_updated.emit(bridge.all_stats())
    assert panels.shown_model() == "default" and panels.panel.models.isHidden()


def test_each_model_keeps_its_own_charts_and_the_panel_shows_the_picked_ones(qtbot, store):
    from app.chats.session import ChatSession

    bridge = TwoModels()
    panels = EnginePanels(ChatSession(store, bridge))
    qtbot.addWidget(panels)
    panels.show()
    for _ in range(3):
        bridge.models_updated.emit(bridge.all_stats())
        bridge.stats_updated.emit(bridge.stats())
    assert panels.panel.history is panels.histories["default"]
    assert panels.histories["default"].values("decode") == [210.0] * 3
    assert panels.histories["default@none"].values("decode") == [0.0] * 3  # recorded while not shown
    panels.panel.models.table.cellClicked.emit(2, 0)
    assert panels.panel.history is panels.panel.charts.history is panels.histories["default@none"]
    bridge.every["default@none"] = dataclasses.replace(large(), decode_tokens_per_s=17.5)
    bridge.models_updated.emit(bridge.all_stats())
    bridge.stats_updated.emit(bridge.stats())
    assert panels.histories["default@none"].values("decode")[-1] == 17.5
    assert panels.histories["default"].values("decode") == [210.0] * 4  # once per tick, shown or not
    del bridge.every["default@none"]
    bridge.models_updated.emit(bridge.all_stats())
    bridge.stats_updated.emit(bridge.stats())
    assert set(panels.histories) == {"default"} and panels.panel.history is panels.histories["default"]


def test_the_unload_button_unloads_the_model_shown_asking_while_it_writes(qtbot, qloop, store, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from app.chats.session import ChatSession

    unloaded = []

    class Unloading(TwoModels):
        async def unload(self, model):
            unloaded.append(model)
            del self.every[model]
            self.models_updated.emit(self.all_stats())

    bridge = Unloading()
    panels = EnginePanels(ChatSession(store, bridge))
    qtbot.addWidget(panels)
    panels.show()
    bridge.models_updated.emit(bridge.all_stats())
    button = panels.panel.models.unload
    assert not button.isEnabled()  # the chat on screen runs on the model shown
    panels.panel.models.table.cellClicked.emit(2, 0)
    assert button.isEnabled() and button.text() == "Unload default@none"
    asked = []
    monkeypatch.setattr(QMessageBox, "question", lambda *a: asked.append(a[2]) or QMessageBox.No)
    button.click()  # two requests wait on it: asked, and the answer is no
    assert asked and "2 replies are being written by default@none" in asked[0] and unloaded == []
    monkeypatch.setattr(QMessageBox, "question", lambda *a: QMessageBox.Yes)
    future = panels.unload("default@none")
    qloop.run_until_complete(future)
    assert unloaded == ["default@none"] and panels.panel.models.isHidden() and panels.shown_model() == "default"
