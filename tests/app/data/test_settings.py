"""Sampling settings are checked by the engine's own rules wherever they enter: settings.json and the dialogs."""

import json
import logging
import math
import os

import pytest

from app.data.settings import (
    DEFAULTS,
    Settings,
    SettingsError,
    engine_cpu_options,
    engine_load_options,
    idle_unload_s,
    load_presets,
    routes_of,
    sampling_problems,
)
from app.dialogs.chat_settings import ChatSettingsDialog
from app.dialogs.preferences import PreferencesDialog
from engine import EngineConfig
from engine.routing.router import Routes


def test_sampling_problems_name_the_field_the_engine_refuses():
    assert sampling_problems(dict(DEFAULTS["sampling"])) == {}
    problems = sampling_problems({"temperature": -1.0, "top_k": [1], "seed": "x", "max_tokens": 0})
    assert set(problems) == {"temperature", "top_k", "seed", "max_tokens"}
    assert all(key in reason for key, reason in problems.items())


@pytest.mark.parametrize(("key", "value"), [("temperature", math.nan), ("seed", 1.5), ("top_k", 2.5)])
def test_values_the_engine_now_refuses_are_problems(key, value):
    assert key in sampling_problems({key: value})


def test_a_bad_sampling_value_in_settings_json_falls_back_to_its_default(tmp_path, caplog):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "dark", "sampling": {"temperature": "hot", "top_k": [3], "top_p": 0.5}}))
    with caplog.at_level(logging.WARNING, logger="app.data.settings"):
        settings = Settings(path)
    sampling = settings["sampling"]
    assert sampling["temperature"] == DEFAULTS["sampling"]["temperature"] and sampling["top_k"] == 0
    assert sampling["top_p"] == 0.5 and settings["theme"] == "dark"
    assert "temperature='hot'" in caplog.text and "top_k=[3]" in caplog.text


def test_wrongly_typed_top_level_values_fall_back_with_a_warning(tmp_path, caplog):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": 7, "sampling": "hot", "model": ["x"], "preset": "Concise"}))
    with caplog.at_level(logging.WARNING, logger="app.data.settings"):
        settings = Settings(path)
    assert settings["theme"] == "system" and settings["sampling"] == DEFAULTS["sampling"]
    assert settings["model"] == "default" and settings["preset"] == "Concise"
    assert "theme=7" in caplog.text


@pytest.mark.parametrize(("saved", "threads", "lower"), [
    ({"threads": 3, "lower_priority": True}, 3, True),
    ({"threads": "auto"}, "auto", False),
    ({"threads": 0, "lower_priority": "yes"}, "auto", False),
    ({"threads": True}, "auto", False),
    ({"threads": "8"}, "auto", False),
])
def test_the_cpu_settings_keep_what_the_engine_takes_and_nothing_else(tmp_path, saved, threads, lower):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(saved))
    settings = Settings(path)
    assert (settings["threads"], settings["lower_priority"]) == (threads, lower)
    options = engine_cpu_options(settings)
    assert options == {"threads": None if threads == "auto" else threads, "lower_priority": lower}
    EngineConfig(**options)  # the engine takes them


@pytest.mark.parametrize(("saved", "kept"), [("q8_0", "q8_0"), ("fp8", "fp8"), ("q4_0", "auto"), (8, "auto")])
def test_the_kv_cache_format_keeps_what_the_engine_takes(tmp_path, saved, kept):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"kv_cache_dtype": saved, "threads": 2}))
    options = engine_load_options(Settings(path), "default", "auto")
    assert options == {"threads": 2, "lower_priority": False, "kv_cache_dtype": kept, "kv_disk_cache": True,
                       "speculation": "auto", "draft_model": None, "draft_quantization": "int4"}
    EngineConfig(**options)


@pytest.mark.parametrize(("saved", "kept"), [("ngram", "ngram"), ("off", "off"), ("draft", "auto"), (True, "auto")])
def test_the_speculation_mode_keeps_what_the_engine_takes(tmp_path, saved, kept):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"speculation": saved}))
    options = engine_load_options(Settings(path), "default", "auto")
    assert options["speculation"] == kept
    assert EngineConfig(**options).speculation == kept


@pytest.mark.parametrize(("saved", "kept"), [
    ({"rules": [{"model": "big", "has_code": True}], "fallback": "small"},
     {"rules": [{"model": "big", "has_code": True}], "fallback": "small", "sticky": True}),
    ({"rules": [{"model": "big"}]}, None),  # a rule with no condition: the default routes, with a warning
    ("fast please", None),
    (None, None),
])
def test_the_routes_keep_what_the_router_can_follow(tmp_path, caplog, saved, kept):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"routes": saved}))
    with caplog.at_level(logging.WARNING):
        settings = Settings(path)
    assert settings["routes"] == kept
    assert routes_of(settings) == (Routes.from_dict(kept) if kept else None)
    assert ("ignoring the routes" in caplog.text) == (saved is not None and kept is None)


@pytest.mark.parametrize(("saved", "seconds"), [(0, None), (15, 900.0), (-1, None), (True, None), ("5", None)])
def test_the_idle_unload_time_is_whole_minutes(tmp_path, saved, seconds):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"idle_unload_minutes": saved}))
    assert idle_unload_s(Settings(path)) == seconds


def test_a_draft_model_is_kept_per_model_and_quantisation(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"drafts": {"default@none": "default", "big@int8": "small", "bad@none": 3,
                                           "empty@none": " "}}))
    settings = Settings(path)
    assert settings["drafts"] == {"default@none": "default", "big@int8": "small"}  # the bad ones dropped
    for model, quantization, draft in (("default", "none", "default"), ("default", "int4", None),
                                       ("big", "int8", "small"), ("small", "int8", None)):
        options = engine_load_options(settings, model, quantization)
        assert (options["draft_model"], options["draft_quantization"]) == (draft, "int4")
        assert EngineConfig(model=model, quantization=quantization, **options).draft_model == draft


@pytest.mark.parametrize(("saved", "drafts"), [(True, {"m@none": "m"}), (False, {}), ("yes", {})])
def test_an_earlier_versions_self_draft_becomes_the_served_models_draft(tmp_path, saved, drafts):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"self_draft": saved, "model": "m", "quantization": "none"}))
    assert Settings(path)["drafts"] == drafts


@pytest.mark.parametrize("text", ["[1, 2]", "\"settings\"", "{\"theme\": ", "\udcff"])
def test_a_file_that_is_not_an_object_of_settings_is_an_error(tmp_path, text):
    path = tmp_path / "settings.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(SettingsError):
        Settings(path)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_settings_are_saved_readable_by_the_user_only(tmp_path):
    settings = Settings(tmp_path / "config" / "settings.json")
    settings.save()
    assert (tmp_path / "config" / "settings.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "config").stat().st_mode & 0o777 == 0o700


def test_the_chat_settings_dialog_opens_on_bad_stored_values(qtbot, store):
    from app.data.personas import Personas

    bad = {**DEFAULTS["sampling"], "temperature": "hot", "top_k": [2], "seed": "lucky"}
    dialog = ChatSettingsDialog(Personas(store, load_presets()), None, "", bad)
    qtbot.addWidget(dialog)
    values = dialog.result_values()["settings"]
    assert values["temperature"] == DEFAULTS["sampling"]["temperature"] and values["top_k"] == 0
    assert values["seed"] is None


def test_the_dialog_refuses_values_the_engine_refuses(qtbot, monkeypatch):
    warnings = []
    monkeypatch.setattr("app.dialogs.sampling_form.QMessageBox.warning",
                        lambda parent, title, text: warnings.append(text))
    monkeypatch.setattr("app.dialogs.sampling_form.sampling_problems",
                        lambda values: {"top_p": "top_p must be in (0, 1]"} if values["top_p"] < 0.5 else {})
    dialog = PreferencesDialog(load_presets(), {**DEFAULTS}, None)
    qtbot.addWidget(dialog)
    dialog.sampling.top_p.setValue(0.2)
    dialog.accept()
    assert dialog.result() == 0 and warnings == ["top_p must be in (0, 1]"]
    dialog.sampling.top_p.setValue(0.9)
    dialog.accept()
    assert dialog.result() == 1
