"""Models > Routing: the rules an Auto chat follows, edited as a table, and the latest evaluation per model."""

import asyncio

from PySide6.QtWidgets import QComboBox

from app.dialogs.routing import COLUMNS, PRIMARY, RoutingDialog
from engine.routing.evaluation import Answer, Choice, ModelScore, RouteEvaluation, Task, TaskSet
from engine.routing.router import Routes, Rule

FIELDS = [field for _, field, _ in COLUMNS]
ROUTES = Routes([Rule("big", has_code=True, min_score=0.5), Rule("big", min_chars=600, max_chars=9000),
                 Rule("small", keywords=("hello", "thanks"), needs="json", min_context_chars=20)], "small",
                sticky=False)


def dialog_for(qtbot, routes=ROUTES, evaluation=None, run=None):
    dialog = RoutingDialog(routes, ["small", "big"], evaluation, run)
    qtbot.addWidget(dialog)
    return dialog


def set_cell(dialog, row, field, text):
    column = FIELDS.index(field)
    widget = dialog.table.cellWidget(row, column)
    if isinstance(widget, QComboBox):
        widget.setCurrentText(text)
    else:
        dialog.table.item(row, column).setText(text)


def cell(dialog, row, field):
    column = FIELDS.index(field)
    widget = dialog.table.cellWidget(row, column)
    return widget.currentText() if isinstance(widget, QComboBox) else dialog.table.item(row, column).text()


def evaluation():
    tasks = TaskSet((Task("factual", "Capital of France?", ("paris",)), Task("code", "Write a function", ("def",)),
                     Task("arithmetic", "What is 2 + 3?", ("5",))), {"factual": 8, "code": 8, "arithmetic": 8})
    small = ModelScore("small", [Answer(0, True, "Paris", 0.02, 4, 200.0), Answer(1, False, "no", 0.02, 4, 200.0),
                                 Answer(2, False, "6", 0.02, 4, 200.0)])
    big = ModelScore("big", [Answer(0, True, "Paris", 0.1, 4, 20.0), Answer(1, True, "def f", 0.1, 4, 20.0),
                             Answer(2, True, "5", 0.1, 4, 20.0)])
    choices = [Choice(0, "small", "no rule matched: the fallback"), Choice(1, "big", "the message says 'function'"),
               Choice(2, "small", "no rule matched: the fallback")]
    return RouteEvaluation(tasks, [small, big], choices, ROUTES.to_dict(), "Test CPU", 1_700_000_000.0)


def test_the_rules_round_trip_through_the_table(qtbot):
    dialog = dialog_for(qtbot)
    assert dialog.table.rowCount() == 3 and not dialog.use_default.isChecked()
    assert (cell(dialog, 0, "has_code"), cell(dialog, 0, "min_score")) == ("yes", "50")
    assert cell(dialog, 2, "keywords") == "hello, thanks" and dialog.fallback.currentText() == "small"
    assert dialog.routes().to_dict() == ROUTES.to_dict()
    dialog.accept()
    assert dialog.result() and dialog.chosen().to_dict() == ROUTES.to_dict()


def test_the_default_routes_are_none_and_lock_the_table(qtbot):
    dialog = dialog_for(qtbot, routes=None)
    assert dialog.use_default.isChecked() and not dialog.table.isEnabled() and dialog.table.rowCount() == 0
    assert dialog.routes() is None and dialog.fallback.currentText() == PRIMARY
    dialog.use_default.setChecked(False)
    assert dialog.table.isEnabled()
    dialog.add_button.click()
    set_cell(dialog, 0, "model", "big")
    set_cell(dialog, 0, "keywords", "explain, why")
    set_cell(dialog, 0, "has_code", "any")
    routes = dialog.routes()
    assert routes.rules == [Rule("big", keywords=("explain", "why"))] and routes.fallback is None and routes.sticky


def test_rules_move_and_go_keeping_what_was_typed(qtbot):
    dialog = dialog_for(qtbot)
    set_cell(dialog, 1, "min_chars", "700")
    dialog.table.selectRow(1)
    dialog.up_button.click()
    assert dialog.table.currentRow() == 0
    assert [r.min_chars for r in dialog.routes().rules] == [700, None, None]
    dialog.down_button.click()
    dialog.down_button.click()
    assert [r.model for r in dialog.routes().rules] == ["big", "small", "big"]
    dialog.remove_button.click()
    assert [r.to_dict() for r in dialog.routes().rules] == [ROUTES.rules[0].to_dict(), ROUTES.rules[2].to_dict()]


def test_a_bad_cell_is_said_in_words_and_the_dialog_stays_with_the_input(qtbot):
    dialog = dialog_for(qtbot)
    set_cell(dialog, 1, "min_chars", "lots")
    dialog.accept()
    assert not dialog.result() and dialog.error.isVisibleTo(dialog)
    assert dialog.error.text() == "Rule 2: message ≥ must be a whole number of characters, not 'lots'"
    assert cell(dialog, 1, "min_chars") == "lots"
    set_cell(dialog, 1, "min_chars", "")
    set_cell(dialog, 1, "max_chars", "")
    dialog.accept()  # a row with no condition left is refused by the router's own rule
    assert not dialog.result() and "Rule 2: the rule for big sets no condition" in dialog.error.text()
    set_cell(dialog, 1, "min_score", "140")
    dialog.accept()
    assert not dialog.result() and dialog.error.text() == "Rule 2: min score must be from 0 to 100 %, not '140'"
    set_cell(dialog, 1, "min_score", "60%")
    dialog.accept()
    assert dialog.result() and dialog.chosen().rules[1] == Rule("big", min_score=0.6)


def test_the_evaluation_shows_each_model_and_where_each_task_went(qtbot):
    dialog = dialog_for(qtbot, evaluation=evaluation())
    assert "Test CPU" in dialog.evaluation_note.text() and "3 tasks" in dialog.evaluation_note.text()
    rows = [[dialog.scores.item(r, c).text() for c in range(dialog.scores.columnCount())]
            for r in range(dialog.scores.rowCount())]
    assert rows[0] == ["small", "100%", "0%", "0%", "33%", "20 ms", "200.0", "2"]
    assert rows[1] == ["big", "100%", "100%", "100%", "100%", "100 ms", "20.0", "1"]
    assert rows[2][0] == "auto (routed)" and rows[2][4] == "67%"
    assert [dialog.choices.item(r, 3).text() for r in range(3)] == ["yes", "yes", "no"]
    assert dialog.choices.item(1, 1).text() == "big" and "'function'" in dialog.choices.item(1, 2).text()
    assert not dialog.run_button.isVisible()  # nothing to run it with


def test_no_evaluation_says_how_to_get_one(qtbot):
    dialog = dialog_for(qtbot)
    assert "No evaluation yet" in dialog.evaluation_note.text() and dialog.scores.rowCount() == 0


def test_running_the_evaluation_routes_by_the_rules_as_edited(qtbot, qloop):
    asked = []

    async def run(routes):
        asked.append(routes)
        await asyncio.sleep(0)
        return evaluation()

    dialog = dialog_for(qtbot, run=run)
    set_cell(dialog, 0, "model", "small")
    task = dialog.start_evaluation()
    assert not dialog.run_button.isEnabled()
    qtbot.waitUntil(task.done)
    assert asked[0].rules[0].model == "small" and dialog.scores.rowCount() == 3 and dialog.run_button.isEnabled()

    async def fail(routes):
        raise RuntimeError("no local model is loaded")

    dialog.run_evaluation = fail
    task = dialog.start_evaluation()
    qtbot.waitUntil(task.done)
    assert dialog.evaluation_note.text() == "The evaluation stopped: no local model is loaded"
    set_cell(dialog, 0, "min_chars", "x")
    assert dialog.start_evaluation() is None and dialog.evaluation_note.text().startswith("Fix the rules first.")


def test_the_models_menu_opens_it_and_ok_keeps_the_rules_with_the_settings(window, qtbot):
    window.commands["routing"].trigger()
    dialog = window.findChild(RoutingDialog)
    assert dialog is not None and dialog.use_default.isChecked()
    dialog.use_default.setChecked(False)
    dialog.add_button.click()
    set_cell(dialog, 0, "model", "default@none")
    set_cell(dialog, 0, "keywords", "prove")
    dialog.accept()
    saved = window.session.settings["routes"]
    assert saved["rules"] == [{"model": "default@none", "keywords": ["prove"], "has_code": True}]
    assert window.session.router.routes.rules[0].model == "default@none" and window.session.router.given
