"""One table model for the window's flat tables of rows (processes, recorded sessions).

A row is any object; a subclass says what each column shows of it, how it sorts and
what its tooltip says. The list is small (tens to hundreds of rows), so a new list
replaces the old one with a model reset. The Tensors panel, a tree of storages and their
tensors that can hold 60,000 rows, has a model of its own (gui/panels/tensor_model.py).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, QPersistentModelIndex, Qt

#: Role of a cell's raw value, which sorting uses (dates, bytes and seconds sort as numbers).
SORT_ROLE = Qt.UserRole + 1
_RIGHT = int(Qt.AlignRight | Qt.AlignVCenter)


class RowTableModel(QAbstractTableModel):
    """Rows of one kind under :attr:`columns`; subclasses define :meth:`display`."""

    #: Column titles, and each column's header tooltip.
    columns: tuple[str, ...] = ()
    tips: tuple[str, ...] = ()
    #: Columns of numbers, aligned right.
    right_aligned: frozenset[int] = frozenset()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.rows: list[Any] = []

    def set_rows(self, rows: list[Any]) -> None:
        """Replace every row."""
        self.beginResetModel()
        self.rows = list(rows)
        self.endResetModel()

    def display(self, row: Any, col: int) -> str:
        """What column ``col`` shows of ``row``."""
        raise NotImplementedError

    def sort_value(self, row: Any, col: int) -> Any:
        """What column ``col`` sorts ``row`` by (its text unless said otherwise)."""
        return self.display(row, col)

    def tooltip(self, row: Any, col: int) -> str | None:
        """A cell's tooltip: its column's, unless said otherwise."""
        return self.tips[col] if col < len(self.tips) else None

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.columns)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole
    ) -> Any:
        if orientation != Qt.Horizontal or not 0 <= section < len(self.columns):
            return None
        if role == Qt.DisplayRole:
            return self.columns[section]
        if role == Qt.ToolTipRole and section < len(self.tips):
            return self.tips[section]
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.rows):
            return None
        row, col = self.rows[index.row()], index.column()
        if role == Qt.DisplayRole:
            return self.display(row, col)
        if role == SORT_ROLE:
            return self.sort_value(row, col)
        if role == Qt.ToolTipRole:
            return self.tooltip(row, col)
        if role == Qt.TextAlignmentRole and col in self.right_aligned:
            return _RIGHT
        return None
