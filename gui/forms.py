"""Form fields made from what they are: a caption, a tooltip, a value, what they do.

The Tune and Lab panels build their forms from these, so that each field is one
statement that reads as its description, and none is made without its tooltip (a field
with no tooltip is a question the user cannot ask).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFrame,
    QHeaderView,
    QLayout,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QTableWidget,
    QWidget,
)


def button(text: str, tip: str, clicked: Callable[[], object], shortcut: str = "") -> QPushButton:
    """A push button that calls ``clicked``; ``shortcut`` (such as "Ctrl+Return") too."""
    widget = QPushButton(text)
    widget.setToolTip(tip)
    if shortcut:
        widget.setShortcut(shortcut)
    widget.clicked.connect(clicked)
    return widget


def line_edit(tip: str, text: str = "", placeholder: str = "") -> QLineEdit:
    """A one-line text field, filled with ``text`` or showing ``placeholder`` when empty."""
    widget = QLineEdit(text)
    widget.setToolTip(tip)
    if placeholder:
        widget.setPlaceholderText(placeholder)
    return widget


def spin_box(tip: str, lowest: int, highest: int, value: int, special: str = "") -> QSpinBox:
    """A whole-number field from ``lowest`` to ``highest``; ``special`` is shown instead of
    the lowest value (what the lowest means, such as "1 (the script alone)")."""
    widget = QSpinBox()
    widget.setRange(lowest, highest)
    widget.setValue(value)
    widget.setToolTip(tip)
    if special:
        widget.setSpecialValueText(special)
    return widget


def combo_box(tip: str, items: Iterable[str | tuple[str, object]]) -> QComboBox:
    """A drop-down list of ``items``: texts, or (text, data) pairs."""
    widget = QComboBox()
    for item in items:
        if isinstance(item, tuple):
            widget.addItem(item[0], item[1])
        else:
            widget.addItem(item)
    widget.setToolTip(tip)
    return widget


def read_only_table(
    columns: list[str], tips: Iterable[str] = (), stretch: int | None = None
) -> QTableWidget:
    """A table of results the user reads but does not edit: ``columns`` as headers (with
    ``tips``, one a column), no row numbers, columns as wide as their contents, and
    column ``stretch`` taking the room left."""
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(columns)
    for col, tip in enumerate(tips):
        table.horizontalHeaderItem(col).setToolTip(tip)
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QTableWidget.NoEditTriggers)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeToContents)
    if stretch is not None:
        header.setSectionResizeMode(stretch, QHeaderView.Stretch)
    return table


def check_box(text: str, tip: str, checked: bool = False) -> QCheckBox:
    """A check box, ticked or not to begin with."""
    widget = QCheckBox(text)
    widget.setChecked(checked)
    widget.setToolTip(tip)
    return widget


def scrolling_column(layout: QLayout) -> QScrollArea:
    """``layout`` (a form and its buttons) as a column that scrolls below its height.

    The Tune and Lab panels are tabs of one dock area, whose height is the largest of
    their minimums: a form laid out at its full height (the Lab's asked for 373 px)
    held the whole area at that height, and a short dock squeezed a form's rows into
    each other."""
    inner = QWidget()
    inner.setLayout(layout)
    column = QScrollArea()
    column.setWidget(inner)
    column.setWidgetResizable(True)
    column.setFrameShape(QFrame.NoFrame)
    column.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    # It scrolls down, never sideways: as wide as the form, and its scroll bar.
    width = inner.minimumSizeHint().width() + column.verticalScrollBar().sizeHint().width()
    column.setMinimumWidth(width)
    return column
