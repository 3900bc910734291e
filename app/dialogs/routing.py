"""Routing: the rules that pick the model for an Auto chat, and the evaluation that says how each model does.

The rules tab edits :class:`~engine.routing.router.Routes` as a table, one rule per row in the order they are
tried; the evaluation tab shows the latest ``eval-route`` (accuracy per kind of task, TTFT, tokens/s, where the
router sent each task) and can run it again on the resident models.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.routing.evaluation import CATEGORIES, RouteEvaluation
from engine.routing.router import CAPABILITIES, Routes, Rule

from ..theme import ERROR

# The rule table's columns: heading, the Rule field it edits, and its tooltip.
COLUMNS = (
    ("Model", "model", "The model that answers when every condition set in this row holds"),
    ("Message ≥", "min_chars", "The message has at least this many characters"),
    ("Message ≤", "max_chars", "The message has at most this many characters"),
    ("Conversation ≥", "min_context_chars", "The whole conversation has at least this many characters"),
    ("Code", "has_code", "The message has code (a fenced block, or lines that read as code), or has none"),
    ("Keywords", "keywords", "Any of these words in the message, separated by commas"),
    ("Needs", "needs", "The request needs this capability"),
    ("Min score", "min_score", "The model answered at least this share of the evaluation's tasks of the "
                               "message's kind (code, arithmetic or factual), in percent"),
)
FIELDS = [field for _, field, _ in COLUMNS]
CODE_CHOICES = {"any": None, "yes": True, "no": False}
PRIMARY = "(the first model loaded)"
EVALUATION_HEADINGS = ("Model", *(c.capitalize() for c in CATEGORIES), "Overall", "TTFT p50", "Tokens/s",
                       "Tasks routed here")

RunEvaluation = Callable[[Routes | None], Awaitable[RouteEvaluation]]  # routes the tasks by the given routes


class RoutingDialog(QDialog):
    """Edit the routes (``routes`` None: the default ones) among ``models`` (the names offered; any other can be
    typed), and show ``evaluation``; ``run_evaluation`` (None: not offered) runs a new one."""

    def __init__(self, routes: Routes | None, models: list[str], evaluation: RouteEvaluation | None,
                 run_evaluation: RunEvaluation | None = None, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Routing")
        self.resize(900, 520)
        self.models = list(dict.fromkeys(models + _named_in(routes)))
        self.run_evaluation = run_evaluation
        self.evaluation_task: asyncio.Task | None = None
        self._chosen: Routes | None = routes
        self.tabs = tabs = QTabWidget()
        tabs.addTab(self._rules_tab(routes), "Rules")
        tabs.addTab(self._evaluation_tab(), "Evaluation")
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(buttons)
        self.show_evaluation(evaluation)

    # -- the rules ---------------------------------------------------------------------------------

    def _rules_tab(self, routes: Routes | None) -> QWidget:
        self.use_default = QCheckBox("Use the default routes: the larger resident model for code, long messages "
                                     "and questions that ask why or how; the faster one for the rest")
        self.use_default.setChecked(routes is None)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setAccessibleName("Routing rules, tried from the top")
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        for column, (heading, _, tip) in enumerate(COLUMNS):
            item = QTableWidgetItem(heading)
            item.setToolTip(tip)
            self.table.setHorizontalHeaderItem(column, item)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(FIELDS.index("keywords"), QHeaderView.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.add_button = QPushButton("Add rule")
        self.remove_button = QPushButton("Remove")
        self.up_button = QPushButton("Move up")
        self.down_button = QPushButton("Move down")
        self.add_button.clicked.connect(lambda: self.add_rule(Rule(self.models[0] if self.models else "default",
                                                                   has_code=True)))
        self.remove_button.clicked.connect(self.remove_rule)
        self.up_button.clicked.connect(lambda: self.move_rule(-1))
        self.down_button.clicked.connect(lambda: self.move_rule(1))
        row_buttons = QHBoxLayout()
        for button in (self.add_button, self.remove_button, self.up_button, self.down_button):
            row_buttons.addWidget(button)
        row_buttons.addStretch(1)
        self.fallback = self._model_box(routes.fallback if routes and routes.fallback else PRIMARY, PRIMARY)
        self.fallback.setAccessibleName("Fallback model")
        self.sticky = QCheckBox("Keep a conversation on the model its earlier turns ran on (moving it costs a "
                                "whole re-prefill)")
        self.sticky.setChecked(routes.sticky if routes else True)
        fallback_row = QHBoxLayout()
        fallback_row.addWidget(QLabel("When no rule matches:"))
        fallback_row.addWidget(self.fallback, 1)
        self.error = QLabel(wordWrap=True)
        self.error.setStyleSheet(f"color: {ERROR};")
        self.error.setAccessibleName("What is wrong with the rules")
        self.error.hide()
        explain = QLabel("The first rule whose conditions all hold and whose model is loaded picks the model; an "
                         "empty cell is not a condition. Routing never loads a model.", wordWrap=True)
        explain.setStyleSheet("color: palette(placeholder-text);")
        tab = QWidget()
        layout = QVBoxLayout(tab)
        layout.addWidget(self.use_default)
        layout.addWidget(explain)
        layout.addWidget(self.table, 1)
        layout.addLayout(row_buttons)
        layout.addLayout(fallback_row)
        layout.addWidget(self.sticky)
        layout.addWidget(self.error)
        for rule in (routes.rules if routes else []):
            self.add_rule(rule)
        self.use_default.toggled.connect(self._default_toggled)
        self._default_toggled(self.use_default.isChecked())
        return tab

    def _model_box(self, current: str, *first: str) -> QComboBox:
        box = QComboBox()
        box.setEditable(True)
        box.addItems([*first, *self.models])
        box.setCurrentText(current)
        return box

    def _default_toggled(self, default: bool) -> None:
        for widget in (self.table, self.add_button, self.remove_button, self.up_button, self.down_button,
                       self.fallback, self.sticky):
            widget.setEnabled(not default)

    def add_rule(self, rule: Rule) -> None:
        """A row for ``rule`` at the end of the table."""
        row = self.table.rowCount()
        self.table.insertRow(row)
        self._fill_row(row, _cells_of(rule))
        self.table.selectRow(row)

    def _fill_row(self, row: int, cells: dict[str, str]) -> None:
        for column, field in enumerate(FIELDS):
            text = cells.get(field, "")
            if field == "model":
                self.table.setCellWidget(row, column, self._model_box(text))
            elif field in ("has_code", "needs"):
                box = QComboBox()
                box.addItems(list(CODE_CHOICES) if field == "has_code" else ["any", *CAPABILITIES])
                box.setCurrentText(text or "any")
                self.table.setCellWidget(row, column, box)
            else:
                self.table.setItem(row, column, QTableWidgetItem(text))

    def _row_cells(self, row: int) -> dict[str, str]:
        cells = {}
        for column, field in enumerate(FIELDS):
            widget = self.table.cellWidget(row, column)
            if isinstance(widget, QComboBox):
                cells[field] = widget.currentText().strip()
            else:
                item = self.table.item(row, column)
                cells[field] = item.text().strip() if item else ""
        return cells

    def remove_rule(self) -> None:
        row = self.table.currentRow()
        if row >= 0:
            self.table.removeRow(row)

    def move_rule(self, step: int) -> None:
        """Move the selected rule ``step`` rows (tried earlier for -1), keeping what was typed in it."""
        row = self.table.currentRow()
        target = row + step
        if row < 0 or not 0 <= target < self.table.rowCount():
            return
        moving, other = self._row_cells(row), self._row_cells(target)
        self._fill_row(row, other)
        self._fill_row(target, moving)
        self.table.selectRow(target)

    def routes(self) -> Routes | None:
        """The routes as edited (None: the default routes); ``ValueError`` saying which rule is wrong and why."""
        if self.use_default.isChecked():
            return None
        rules = []
        for row in range(self.table.rowCount()):
            try:
                rules.append(_rule_of(self._row_cells(row)))
            except ValueError as exc:
                raise ValueError(f"Rule {row + 1}: {exc}") from None
        fallback = self.fallback.currentText().strip()
        return Routes(rules, None if fallback in ("", PRIMARY) else fallback, self.sticky.isChecked())

    def accept(self) -> None:
        """Close only with rules the router can follow; otherwise say what is wrong and keep what was typed."""
        try:
            self._chosen = self.routes()
        except ValueError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        super().accept()

    def chosen(self) -> Routes | None:
        """The routes accepted with OK (the ones given, before)."""
        return self._chosen

    # -- the evaluation ----------------------------------------------------------------------------

    def _evaluation_tab(self) -> QWidget:
        self.evaluation_note = QLabel(wordWrap=True)
        self.scores = QTableWidget(0, len(EVALUATION_HEADINGS))
        self.scores.setHorizontalHeaderLabels(EVALUATION_HEADINGS)
        self.scores.setAccessibleName("Each model's accuracy and speed on the evaluation's tasks")
        self.choices = QTableWidget(0, 4)
        self.choices.setHorizontalHeaderLabels(("Task", "Routed to", "Why", "Right"))
        self.choices.setAccessibleName("Where the router sent each task")
        self.choices.horizontalHeader().setSectionResizeMode(2, QHeaderView.Stretch)
        self.choices.setColumnWidth(0, 300)
        self.scores.horizontalHeader().setStretchLastSection(True)
        for table in (self.scores, self.choices):
            table.setEditTriggers(QAbstractItemView.NoEditTriggers)
            table.verticalHeader().setVisible(False)
            table.setWordWrap(False)
        self.run_button = QPushButton("Run evaluation")
        self.run_button.setToolTip("Every loaded model answers the shipped tasks (factual, arithmetic, code), "
                                   "one at a time; then the router routes each task")
        self.run_button.setVisible(self.run_evaluation is not None)
        self.run_button.clicked.connect(self.start_evaluation)
        tab = QWidget()
        layout = QVBoxLayout(tab)
        layout.addWidget(self.evaluation_note)
        layout.addWidget(self.scores, 1)
        layout.addWidget(QLabel("Where the router sent each task:"))
        layout.addWidget(self.choices, 2)
        layout.addWidget(self.run_button, 0, Qt.AlignLeft)
        return tab

    def show_evaluation(self, evaluation: RouteEvaluation | None) -> None:
        self.evaluation = evaluation
        if evaluation is None:
            self.evaluation_note.setText("No evaluation yet. Run one to see how each loaded model answers short "
                                         "factual questions, arithmetic and code, and where the router sends "
                                         "each (python -m engine eval-route does the same).")
            self.scores.setRowCount(0)
            self.choices.setRowCount(0)
            return
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(evaluation.measured_at))
        self.evaluation_note.setText(f"Measured {when} on {evaluation.cpu}: {len(evaluation.tasks.tasks)} tasks, "
                                     "greedy, one at a time. Rules with a minimum score read these figures.")
        rows = evaluation.rows()
        self.scores.setRowCount(len(rows))
        for index, row in enumerate(rows):
            ttft = f"{row['ttft_p50_s'] * 1000:.0f} ms" if row["ttft_p50_s"] is not None else "–"
            speed = f"{row['tokens_per_s']:.1f}" if row["tokens_per_s"] else "–"
            cells = [row["model"], *(_percent(row[c]) for c in (*CATEGORIES, "overall")), ttft, speed,
                     str(row["routed_tasks"])]
            for column, text in enumerate(cells):
                self.scores.setItem(index, column, QTableWidgetItem(text))
        self.scores.resizeColumnsToContents()
        self.choices.setRowCount(len(evaluation.choices))
        for index, choice in enumerate(evaluation.choices):
            task = evaluation.tasks.tasks[choice.task]
            right = evaluation.answer_to(choice).correct
            for column, text in enumerate((f"{task.category}: {task.prompt}", choice.model, choice.reason,
                                           "yes" if right else "no")):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.choices.setItem(index, column, item)
        self.choices.resizeColumnToContents(1)

    def start_evaluation(self) -> asyncio.Task | None:
        if self.run_evaluation is None or (self.evaluation_task and not self.evaluation_task.done()):
            return None
        try:
            routes = self.routes()  # the router grades the rules as edited, saved or not
        except ValueError as exc:
            self.evaluation_note.setText(f"Fix the rules first. {exc}")
            return None
        self.run_button.setEnabled(False)
        self.evaluation_note.setText("Evaluating: every loaded model answers each task in turn (about a minute "
                                     "per model on a laptop CPU)…")
        self.evaluation_task = asyncio.ensure_future(self._evaluate(routes))
        return self.evaluation_task

    async def _evaluate(self, routes: Routes | None) -> None:
        try:
            evaluation = await self.run_evaluation(routes)
        except Exception as exc:  # noqa: BLE001 - the engine's reason, shown in words
            self.evaluation_note.setText(f"The evaluation stopped: {exc}")
        else:
            self.show_evaluation(evaluation)
        finally:
            self.run_button.setEnabled(True)

    def done(self, result: int) -> None:
        if self.evaluation_task and not self.evaluation_task.done():
            self.evaluation_task.cancel()
        super().done(result)


def _named_in(routes: Routes | None) -> list[str]:
    if routes is None:
        return []
    return [r.model for r in routes.rules] + ([routes.fallback] if routes.fallback else [])


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _cells_of(rule: Rule) -> dict[str, str]:
    """A rule as the table shows it."""
    cells = {"model": rule.model, "keywords": ", ".join(rule.keywords), "needs": rule.needs or "any",
             "has_code": next(k for k, v in CODE_CHOICES.items() if v is rule.has_code)}
    for field in ("min_chars", "max_chars", "min_context_chars"):
        value = getattr(rule, field)
        cells[field] = "" if value is None else str(value)
    cells["min_score"] = "" if rule.min_score is None else f"{100 * rule.min_score:g}"
    return cells


def _rule_of(cells: dict[str, str]) -> Rule:
    """A table row as a rule; ``ValueError`` in words for a cell that cannot be read."""
    values: dict = {"model": cells["model"], "has_code": CODE_CHOICES[cells["has_code"]],
                    "needs": None if cells["needs"] == "any" else cells["needs"],
                    "keywords": tuple(k.strip() for k in cells["keywords"].split(",") if k.strip())}
    for field, heading in (("min_chars", "message ≥"), ("max_chars", "message ≤"),
                           ("min_context_chars", "conversation ≥")):
        text = cells[field].replace(",", "").replace("_", "")
        if text:
            if not text.isdigit():
                raise ValueError(f"{heading} must be a whole number of characters, not {cells[field]!r}")
            values[field] = int(text)
    score = cells["min_score"].rstrip("%").strip()
    if score:
        try:
            percent = float(score)
        except ValueError:
            raise ValueError(f"min score must be a percentage, not {cells['min_score']!r}") from None
        if not 0 <= percent <= 100:
            raise ValueError(f"min score must be from 0 to 100 %, not {cells['min_score']!r}")
        values["min_score"] = percent / 100
    return Rule(**values)
