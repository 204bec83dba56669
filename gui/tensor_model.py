"""Item model of a census: storages at the top, the tensors viewing each one below.

Built for 100,000 rows: every cell's text and sort key are computed once per census, and
sorting happens in the model (one ``list.sort`` with a precomputed key) rather than
through per-comparison calls into Python. The filter proxy matches a precomputed search
string per storage.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import (
    QAbstractItemModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
)
from PySide6.QtGui import QBrush, QColor

from torchmem.tensors.model import KIND_LABELS, Census, StorageInfo, StorageKey, TensorInfo
from torchmem.units import format_bytes

COLUMNS = ("Name", "Kind", "Bytes", "Shape", "Dtype", "Device", "Views", "grad_fn")
TOOLTIPS = (
    "Best name of the storage (module path, .grad, optimizer state, script variable, "
    "autograd graph, or the container that holds it)",
    "parameter, buffer, gradient, optimizer state, activation / saved for backward, other",
    "Storage rows: the storage's bytes, counted once however many views share it. "
    "Tensor rows: the bytes that tensor spans.",
    "Shape of the tensor (of the first tensor, for a storage)",
    "Element type",
    "Device the memory lives on",
    "How many tensors view this storage",
    "The autograd function that produced the tensor",
)
NEW_COLOR = QColor(255, 196, 0, 70)
IndexLike = QModelIndex | QPersistentModelIndex
_NO_PARENT = -1


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


class TensorModel(QAbstractItemModel):
    """Two-level tree: storage rows, each with its tensor rows."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.census: Census | None = None
        self._storages: list[StorageInfo] = []
        self._new: set[StorageKey] = set()
        self._search: list[str] = []
        self._sort = (2, Qt.DescendingOrder)

    # -- data in ------------------------------------------------------------------------
    def set_census(self, census: Census | None, new: set[StorageKey] | None = None) -> None:
        """Show ``census``; storages in ``new`` are highlighted as new since the last one."""
        self.beginResetModel()
        self.census = census
        self._storages = list(census.storages.values()) if census else []
        self._new = new or set()
        self._search = [self._search_text(s) for s in self._storages]
        self._apply_sort()
        self.endResetModel()

    @staticmethod
    def _search_text(s: StorageInfo) -> str:
        parts = [s.kind, KIND_LABELS[s.kind], s.device]
        for t in s.tensors:
            parts += [*(t.names or (t.name,)), t.name, t.dtype, _shape(t.shape), t.grad_fn]
        return " ".join(parts).lower()

    def storage(self, row: int) -> StorageInfo:
        """The storage shown at top-level ``row``."""
        return self._storages[row]

    def search_text(self, row: int) -> str:
        """Lower-case text a filter matches against, for top-level ``row``."""
        return self._search[row]

    def is_new(self, row: int) -> bool:
        """True when the storage at ``row`` is new since the previous census."""
        return self._storages[row].key in self._new

    def info_at(self, index: IndexLike) -> StorageInfo | TensorInfo | None:
        """The storage or tensor an index points to."""
        if not index.isValid():
            return None
        parent_row = index.internalId() - 1
        if parent_row == _NO_PARENT:
            return self._storages[index.row()]
        return self._storages[parent_row].tensors[index.row()]

    # -- sorting --------------------------------------------------------------------------
    def sort(self, column: int, order: Qt.SortOrder = Qt.AscendingOrder) -> None:
        """Sort storages (and the tensors inside each) by ``column``."""
        self.layoutAboutToBeChanged.emit()
        self._sort = (column, order)
        self._apply_sort()
        self.layoutChanged.emit()

    def _apply_sort(self) -> None:
        column, order = self._sort
        reverse = order == Qt.DescendingOrder
        keys = {
            0: lambda s: s.name.lower(),
            1: lambda s: s.kind,
            2: lambda s: s.nbytes,
            3: lambda s: s.tensors[0].numel if s.tensors else 0,
            4: lambda s: s.tensors[0].dtype if s.tensors else "",
            5: lambda s: s.device,
            6: lambda s: len(s.tensors),
            7: lambda s: s.tensors[0].grad_fn if s.tensors else "",
        }
        key = keys.get(column, keys[2])
        order_idx = sorted(
            range(len(self._storages)), key=lambda i: key(self._storages[i]), reverse=reverse
        )
        self._storages = [self._storages[i] for i in order_idx]
        self._search = [self._search[i] for i in order_idx]

    # -- QAbstractItemModel ---------------------------------------------------------------
    def index(self, row: int, column: int, parent: IndexLike = QModelIndex()) -> QModelIndex:  # noqa: B008
        if not self.hasIndex(row, column, parent):
            return QModelIndex()
        # internalId: 0 for storage rows, parent row + 1 for tensor rows.
        return self.createIndex(row, column, parent.row() + 1 if parent.isValid() else 0)

    def parent(self, index: IndexLike = QModelIndex()) -> QModelIndex:  # noqa: B008
        if not index.isValid():
            return QModelIndex()
        parent_row = index.internalId() - 1
        if parent_row == _NO_PARENT:
            return QModelIndex()
        return self.createIndex(parent_row, 0, 0)

    def rowCount(self, parent: IndexLike = QModelIndex()) -> int:  # noqa: B008
        if not parent.isValid():
            return len(self._storages)
        if parent.column() != 0 or parent.internalId() != 0:
            return 0
        return len(self._storages[parent.row()].tensors)

    def columnCount(self, parent: IndexLike = QModelIndex()) -> int:  # noqa: B008
        return len(COLUMNS)

    def headerData(
        self,
        section: int,
        orientation: Qt.Orientation,
        role: int = Qt.DisplayRole,
    ) -> Any:
        if orientation != Qt.Horizontal or not 0 <= section < len(COLUMNS):
            return None
        if role == Qt.DisplayRole:
            return COLUMNS[section]
        if role == Qt.ToolTipRole:
            return TOOLTIPS[section]
        return None

    def data(self, index: IndexLike, role: int = Qt.DisplayRole) -> Any:
        if not index.isValid():
            return None
        info = self.info_at(index)
        column = index.column()
        if role == Qt.DisplayRole:
            return self._text(info, column)
        if role == Qt.TextAlignmentRole and column in (2, 6):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == Qt.BackgroundRole and isinstance(info, StorageInfo) and info.key in self._new:
            return QBrush(NEW_COLOR)
        if role == Qt.ToolTipRole:
            if isinstance(info, StorageInfo):
                names = sorted({n for t in info.tensors for n in (t.names or (t.name,))})
                return "\n".join(names[:20]) + (
                    " (new since the last census)" if info.key in self._new else ""
                )
            return "\n".join(info.names) if info.names else info.name
        if role == Qt.UserRole:
            return info.nbytes if isinstance(info, StorageInfo) else info.span_bytes
        return None

    @staticmethod
    def _text(info: StorageInfo | TensorInfo, column: int) -> str:
        if isinstance(info, StorageInfo):
            first = info.tensors[0] if info.tensors else None
            values = (
                info.name,
                KIND_LABELS[info.kind],
                format_bytes(info.nbytes),
                _shape(first.shape) if first else "",
                first.dtype if first else "",
                info.device,
                str(len(info.tensors)),
                first.grad_fn if first else "",
            )
        else:
            label = info.name + (" (view)" if info.is_view else "")
            values = (
                label,
                KIND_LABELS[info.kind],
                format_bytes(info.span_bytes),
                _shape(info.shape),
                info.dtype,
                info.device,
                "",
                info.grad_fn,
            )
        return values[column]

    def flags(self, index: IndexLike) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.NoItemFlags
        return Qt.ItemIsEnabled | Qt.ItemIsSelectable


class TensorFilterProxy(QSortFilterProxyModel):
    """Filters storages by words (all must match: name, dtype, device, shape, kind).

    Sorting is delegated to the source model, which sorts 100,000 rows in one pass.
    """

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._words: list[str] = []
        self.setDynamicSortFilter(False)

    def set_filter_text(self, text: str) -> None:
        """Show only storages whose text contains every word of ``text``."""
        self.beginFilterChange()
        self._words = text.lower().split()
        self.endFilterChange()

    def filterAcceptsRow(self, row: int, parent: IndexLike) -> bool:
        if parent.isValid() or not self._words:
            return True
        text = self.sourceModel().search_text(row)
        return all(word in text for word in self._words)

    def sort(self, column: int, order: Qt.SortOrder = Qt.AscendingOrder) -> None:
        self.sourceModel().sort(column, order)
        self.invalidate()
