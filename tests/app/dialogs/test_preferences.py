"""Preferences: each setting is saved and takes effect: the theme at once, the text size at once, the persona
and the sampling for the next new chat."""

import asyncio

import pytest

from app.data.settings import DEFAULTS, Settings
from app.dialogs.preferences import PreferencesDialog


@pytest.fixture
def answer(monkeypatch):
    """Open Preferences through the window, change what ``change(dialog)`` changes, press OK (or Cancel)."""
    def run(window, change, ok=True):
        seen = {}

        def exec_(dialog):
            seen["personas"] = [dialog.preset.itemText(i) for i in range(dialog.preset.count())]
            change(dialog)
            return 1 if ok else 0

        monkeypatch.setattr(PreferencesDialog, "exec", exec_)
        window.edit_preferences()
        return seen
    return run


def saved(window) -> Settings:
    return Settings(window.settings.path)


def test_the_theme_is_saved_and_applied(window, qapp, answer):
    answer(window, lambda d: d.theme.setCurrentText("dark"))
    assert saved(window)["theme"] == "dark"
    assert qapp.palette().window().color().lightness() < 80 and window.chat.renderer.dark
    answer(window, lambda d: d.theme.setCurrentText("light"))
    assert saved(window)["theme"] == "light" and qapp.palette().window().color().lightness() > 180


def test_the_text_size_is_saved_and_applied(window, answer):
    base = window.chat._base_point_size
    answer(window, lambda d: d.text_scale.setValue(150))
    assert saved(window)["text_scale"] == 150
    assert window.chat.page.font().pointSizeF() == pytest.approx(base * 1.5)


def test_the_persona_for_new_chats_lists_the_users_own_and_is_used(window, answer):
    window.personas.save("Pirate", "Arr.")
    seen = answer(window, lambda d: d.preset.setCurrentText("Pirate"))
    assert seen["personas"][-1] == "Pirate" and "Concise" in seen["personas"]
    assert saved(window)["preset"] == "Pirate"
    chat = window.actions.new()
    assert (chat.preset, chat.system_prompt) == ("Pirate", "Arr.")


def test_sampling_defaults_are_saved_and_given_to_new_chats(window, answer):
    def change(dialog):
        dialog.sampling.temperature.setValue(0.2)
        dialog.sampling.top_k.setValue(40)
        dialog.sampling.max_tokens.setValue(1000)
        dialog.sampling.fixed_seed.setChecked(True)
        dialog.sampling.seed.setValue(7)

    answer(window, change)
    expected = {**DEFAULTS["sampling"], "temperature": 0.2, "top_k": 40, "max_tokens": 1000, "seed": 7}
    assert saved(window)["sampling"] == expected
    chat = window.actions.new()
    params = window.controller.sampling_for(chat.id)
    assert (params.temperature, params.top_k, params.max_tokens, params.seed) == (0.2, 40, 1000, 7)


def test_cancel_changes_nothing(window, qapp, answer):
    before = dict(window.settings.values)
    answer(window, lambda d: (d.theme.setCurrentText("dark"), d.text_scale.setValue(200)), ok=False)
    assert window.settings.values == before and not window.chat.renderer.dark
    assert not window.settings.path.exists() or saved(window)["text_scale"] == before["text_scale"]


def test_the_engines_threads_and_priority_are_saved_and_given_to_the_engine_at_once(window, answer):
    bridge = window.bridge
    answer(window, lambda d: d.theme.setCurrentText("light"))
    assert bridge.cpu_options is None  # nothing about the CPU changed: the engine is not disturbed

    def change(dialog):
        dialog.cpu.threads.setCurrentIndex(dialog.cpu.threads.findData(1))
        dialog.cpu.lower_priority.setChecked(True)
    answer(window, change)
    assert (saved(window)["threads"], saved(window)["lower_priority"]) == (1, True)
    assert bridge.cpu_options == (1, True)
    answer(window, lambda d: d.cpu.threads.setCurrentIndex(0))
    assert saved(window)["threads"] == "auto" and bridge.cpu_options == (None, True)


def test_the_speculation_mode_is_saved_and_given_to_the_engine_at_once(window, answer):
    bridge = window.bridge
    answer(window, lambda d: d.theme.setCurrentText("light"))
    assert bridge.speculation is None  # unchanged: the engine is not disturbed
    answer(window, lambda d: d.speculation.mode.setCurrentIndex(d.speculation.mode.findData("off")))
    assert saved(window)["speculation"] == "off" and bridge.speculation == "off"


def test_the_idle_unload_time_is_saved_and_given_to_the_engine_at_once(window, answer):
    assert window.bridge.idle_unload_s is None  # never, by default
    answer(window, lambda d: d.models.idle_minutes.setValue(20))
    assert saved(window)["idle_unload_minutes"] == 20 and window.bridge.idle_unload_s == 1200.0
    seen = {}
    answer(window, lambda d: seen.update(shown=d.models.idle_minutes.text()))
    assert seen["shown"] == "20 min"
    answer(window, lambda d: d.models.idle_minutes.setValue(0))
    assert window.bridge.idle_unload_s is None


def test_the_cpu_form_shows_what_was_saved():
    from app.dialogs.preferences import AUTO_THREADS, CpuForm

    form = CpuForm({"threads": 1, "lower_priority": True})
    assert form.threads.currentText() == "1" and form.lower_priority.isChecked()
    assert CpuForm(DEFAULTS).threads.currentText() == AUTO_THREADS
    assert CpuForm({"threads": 64, "lower_priority": False}).values() == {"threads": 64, "lower_priority": False}


def test_a_new_kv_cache_format_is_saved_and_reloads_the_serving_model_in_it(window, answer, qloop):
    from engine import EngineConfig

    window.bridge.config = EngineConfig(model="default", quantization="int4")
    answer(window, lambda d: d.kv_cache.format.setCurrentIndex(d.kv_cache.format.findData("q8_0")))
    assert saved(window)["kv_cache_dtype"] == "q8_0"
    qloop.run_until_complete(asyncio.sleep(0))  # the switch's task runs
    assert (window.bridge.config.model, window.bridge.config.quantization) == ("default", "int4")
    assert window.bridge.config.kv_cache_dtype == "q8_0"


def test_turning_the_disk_tier_off_is_saved_and_reloads_without_it(window, answer, qloop):
    from engine import EngineConfig

    window.bridge.config = EngineConfig(model="default")
    answer(window, lambda d: d.kv_cache.disk.setChecked(False))
    assert saved(window)["kv_disk_cache"] is False
    qloop.run_until_complete(asyncio.sleep(0))
    assert window.bridge.config.kv_disk_cache is False and window.bridge.config.kv_cache_dtype == "auto"


def test_clear_says_what_it_freed(qtbot):
    from tests.helpers.fake_engine import FakeBridge

    dialog = PreferencesDialog([], DEFAULTS, clear_disk=FakeBridge().clear_disk_cache)
    qtbot.addWidget(dialog)
    with qtbot.wait_signal(dialog.kv_cache.cleared, timeout=10_000) as shown:
        dialog.kv_cache.clear_button.click()
    assert shown.args[0] == "Cleared 3.0 MiB of this model's KV blocks on disk."


def test_the_kv_check_shows_each_formats_figures_beside_it(qtbot):
    from tests.helpers.fake_engine import FakeBridge

    dialog = PreferencesDialog([], DEFAULTS, check_kv=FakeBridge().check_kv_formats)
    qtbot.addWidget(dialog)
    form = dialog.kv_cache
    with qtbot.wait_signal(form.check_shown, timeout=10_000) as shown:
        form.check_button.click()
    assert "q8_0: KL 0.0091, top-1 94.4%" in shown.args[0]
    assert form.format.itemText(form.format.findData("q8_0")) == "q8_0: 27% of float32's memory, KL 0.0091, top-1 94.4%"
    assert "the reference" in form.format.itemText(form.format.findData("float32"))
    assert form.check_button.isEnabled()


def test_the_kv_check_says_so_when_no_model_serves_or_the_check_fails(qtbot):
    from concurrent.futures import Future

    failed = Future()
    failed.set_exception(RuntimeError("the engine thread has stopped"))
    for check, words in ((lambda: None, "No model is loaded"), (lambda: failed, "The check failed: the engine")):
        dialog = PreferencesDialog([], DEFAULTS, check_kv=check)
        qtbot.addWidget(dialog)
        with qtbot.wait_signal(dialog.kv_cache.check_shown, timeout=10_000) as shown:
            dialog.kv_cache.check_button.click()
        assert shown.args[0].startswith(words)
