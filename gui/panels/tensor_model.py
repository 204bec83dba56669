"""Item model of a census: storages at the top, the tensors viewing each one below.

Built for 100,000 rows: every cell's text and sort key are computed once per census,
sorting and filtering happen in the model (one ``sorted`` with a key, one pass over a
precomputed search string per storage) rather than through per-row calls into Python,
and the view gets the rows a chunk at a time.
"""

from __future__ import annotations

import re
from typing import Any

from PySide6.QtCore import (
    QAbstractItemModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
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
_N_COLUMNS = len(COLUMNS)
#: Storage rows handed to the view at a time (more as it scrolls to the end).
CHUNK = 1000


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[str | int, ...]:
    """A sort key that reads the numbers in a name as numbers: ``model.8`` before
    ``model.13``, ``layers.2.attn`` before ``layers.10.attn``; case ignored. Text and
    numbers alternate from a text part, so any two keys compare part by part."""
    parts = _DIGITS.split(name.lower())
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


class TensorModel(QAbstractItemModel):
    """Two-level tree: storage rows, each with its tensor rows; filtered, sorted and shown
    a chunk at a time.

    Filtering and sorting happen here, on plain lists, not in a QSortFilterProxyModel:
    the proxy asked Python about every row (``filterAcceptsRow``, then ``index``,
    ``rowCount`` and ``flags`` for the view's layout), which froze the window for 2 s at
    each census of 60,000 storages. The view is given :data:`CHUNK` rows and asks for
    more as it scrolls (``fetchMore``), so laying it out costs the same for 100 storages
    and for 100,000.
    """

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.census: Census | None = None
        self._all: list[StorageInfo] = []  # every storage, in the sort order
        self._all_search: list[str] | None = []  # None: not made yet (no filter so far)
        self._storages: list[StorageInfo] = []  # those that match the filter
        self._loaded = 0  # how many of them the view has been given
        self._words: list[str] = []
        self._new: set[StorageKey] = set()
        self._sort = (2, Qt.DescendingOrder)

    # -- data in ------------------------------------------------------------------------
    def set_census(self, census: Census | None, new: set[StorageKey] | None = None) -> None:
        """Show ``census``; storages in ``new`` are highlighted as new since the last one."""
        self.beginResetModel()
        self.census = census
        self._all = list(census.storages.values()) if census else []
        self._new = new or set()
        # Made when a filter first needs them: 0.2 s for 60,000 storages at every census,
        # in the window's thread, for a filter most censuses never see.
        self._all_search = None
        self._apply_sort()
        self._apply_filter()
        self.endResetModel()

    def set_filter_text(self, text: str) -> None:
        """Show only storages whose text contains every word of ``text`` (name, dtype,
        device, shape, kind; case does not matter)."""
        words = text.lower().split()
        if words == self._words:
            return
        self.beginResetModel()
        self._words = words
        self._apply_filter()
        self.endResetModel()

    def matching(self) -> int:
        """How many storages match the filter (the view may hold fewer rows so far)."""
        return len(self._storages)

    @staticmethod
    def _search_text(s: StorageInfo) -> str:
        parts = [s.kind, KIND_LABELS[s.kind], s.device]
        for t in s.tensors:
            parts += [*(t.names or (t.name,)), t.name, t.dtype, _shape(t.shape), t.grad_fn]
        return " ".join(parts).lower()

    def _apply_filter(self) -> None:
        words = self._words
        if words:
            if self._all_search is None:
                self._all_search = [self._search_text(s) for s in self._all]
            self._storages = [
                s
                for s, text in zip(self._all, self._all_search, strict=True)
                if all(word in text for word in words)
            ]
        else:
            self._storages = self._all
        self._loaded = min(CHUNK, len(self._storages))

    def storage(self, row: int) -> StorageInfo:
        """The storage shown at top-level ``row``."""
        return self._storages[row]

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
        self.beginResetModel()  # rows beyond the first chunk are handed out again
        self._sort = (column, order)
        self._apply_sort()
        self._apply_filter()
        self.endResetModel()

    def _apply_sort(self) -> None:
        column, order = self._sort
        reverse = order == Qt.DescendingOrder
        keys = {
            0: lambda s: natural_key(s.name),
            1: lambda s: s.kind,
            2: lambda s: s.nbytes,
            3: lambda s: s.tensors[0].numel if s.tensors else 0,
            4: lambda s: s.tensors[0].dtype if s.tensors else "",
            5: lambda s: s.device,
            6: lambda s: len(s.tensors),
            7: lambda s: s.tensors[0].grad_fn if s.tensors else "",
        }
        key = keys.get(column, keys[2])
        order_idx = sorted(range(len(self._all)), key=lambda i: key(self._all[i]), reverse=reverse)
        self._all = [self._all[i] for i in order_idx]
        if self._all_search is not None:
            self._all_search = [self._all_search[i] for i in order_idx]

    # -- lazy rows ------------------------------------------------------------------------
    def canFetchMore(self, parent: IndexLike) -> bool:
        return not parent.isValid() and self._loaded < len(self._storages)

    def fetchMore(self, parent: IndexLike) -> None:
        if parent.isValid():
            return
        more = min(CHUNK, len(self._storages) - self._loaded)
        if more <= 0:
            return
        self.beginInsertRows(QModelIndex(), self._loaded, self._loaded + more - 1)
        self._loaded += more
        self.endInsertRows()

    # -- QAbstractItemModel ---------------------------------------------------------------
    def index(self, row: int, column: int, parent: IndexLike = QModelIndex()) -> QModelIndex:  # noqa: B008
        # Bounds checked here, not by hasIndex(), which calls back into Python twice: the
        # view asks for an index of every row it lays out.
        if not 0 <= column < _N_COLUMNS or row < 0:
            return QModelIndex()
        if not parent.isValid():
            if row < self._loaded:
                return self.createIndex(row, column, 0)
        elif parent.internalId() == 0 and parent.column() == 0:
            # internalId: 0 for storage rows, parent row + 1 for tensor rows.
            parent_row = parent.row()
            if parent_row < self._loaded and row < len(self._storages[parent_row].tensors):
                return self.createIndex(row, column, parent_row + 1)
        return QModelIndex()

    def parent(self, index: IndexLike = QModelIndex()) -> QModelIndex:  # noqa: B008
        if not index.isValid():
            return QModelIndex()
        parent_row = index.internalId() - 1
        if parent_row == _NO_PARENT:
            return QModelIndex()
        return self.createIndex(parent_row, 0, 0)

    def rowCount(self, parent: IndexLike = QModelIndex()) -> int:  # noqa: B008
        if not parent.isValid():
            return self._loaded
        if parent.column() != 0 or parent.internalId() != 0:
            return 0
        return len(self._storages[parent.row()].tensors)

    def hasChildren(self, parent: IndexLike = QModelIndex()) -> bool:  # noqa: B008
        # The view asks this of every row it lays out: one call, not rowCount's path.
        if not parent.isValid():
            return bool(self._storages)
        if parent.internalId() != 0 or parent.column() != 0:
            return False
        return bool(self._storages[parent.row()].tensors)

    def columnCount(self, parent: IndexLike = QModelIndex()) -> int:  # noqa: B008
        return _N_COLUMNS

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
