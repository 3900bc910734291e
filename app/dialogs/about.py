"""Help > About Kvasir: the version, and the bundled model and main libraries with their licences."""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt, qVersion
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from ..data.licences import Component, components
from ..resources import app_icon
from ..version import __version__


class AboutDialog(QDialog):
    """Name, version and what Kvasir is built from; one row per component: what it is, version, licence."""

    def __init__(self, parent=None, listed: list[Component] | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About Kvasir")
        self.components = components() if listed is None else listed
        header = QHBoxLayout()
        logo = QLabel()
        logo.setPixmap(app_icon().pixmap(64, 64))
        header.addWidget(logo, 0, Qt.AlignTop)
        self.title = QLabel(
            f"<h2>Kvasir {escape(__version__)}</h2>"
            "<p>Chat with language models that run on this computer.<br>"
            f"Licensed under the Apache License 2.0. Built on Qt {escape(qVersion())}.</p>")
        self.title.setTextInteractionFlags(Qt.TextSelectableByMouse)
        header.addWidget(self.title, 1)
        self.table = QTableWidget(len(self.components), 3)
        self.table.setHorizontalHeaderLabels(["Component", "Version", "Licence"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.NoSelection)
        self.table.setFocusPolicy(Qt.NoFocus)
        for row, component in enumerate(self.components):
            self._add_row(row, component)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.Stretch)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)  # long licences wrap
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addWidget(QLabel("Kvasir includes:"))
        layout.addWidget(self.table, 1)
        layout.addWidget(buttons)
        self.resize(860, 540)

    def _add_row(self, row: int, component: Component) -> None:
        name = QTableWidgetItem(f"{component.role} ({component.name})")
        name.setToolTip(component.name)
        licence = QTableWidgetItem(component.licence)
        licence.setToolTip(component.licence)  # compound expressions (torch's) are longer than the column
        for column, item in enumerate((name, QTableWidgetItem(component.version), licence)):
            self.table.setItem(row, column, item)

    def licence_of(self, distribution: str) -> str | None:
        """The licence shown for ``distribution``, or None when it is not listed."""
        for component in self.components:
            if component.name.lower().replace("_", "-") == distribution.lower().replace("_", "-"):
                return component.licence
        return None
