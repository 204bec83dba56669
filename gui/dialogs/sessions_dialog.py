"""The Sessions dialog: the recorded runs of the sessions folder, to open, rename or delete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QSortFilterProxyModel,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHeaderView,
    QInputDialog,
    QLabel,
    QMessageBox,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from torchmem.gui.row_table import SORT_ROLE, RowTableModel
from torchmem.record.library import SessionEntry, file_bytes, list_sessions, sessions_dir
from torchmem.record.store import SUFFIX, RecordError, rename_session
from torchmem.units import format_bytes, format_duration

COLUMNS = ("Recorded", "Run", "Ended", "Duration", "Peak", "Alerts", "Size")
TIPS = (
    "When the run started (local time)",
    "Its name: the script's file name until you rename it",
    "How the run ended; 'interrupted' when the recording stopped without its end "
    "(torchmem or the machine was stopped: kill -9, a crash, a power cut)",
    "Time from the first to the last reading",
    "Highest memory the run reached: an accelerator's peak allocated, or the process RSS",
    "Alerts the run raised (leaks, capacity, cache growth)",
    "Space the session takes on disk",
)


class SessionModel(RowTableModel):
    """Rows of :class:`~torchmem.record.library.SessionEntry`."""

    columns, tips = COLUMNS, TIPS
    right_aligned = frozenset(range(3, len(COLUMNS)))

    def display(self, row: SessionEntry, col: int) -> str:
        """The cell's text."""
        return _display(row, col)

    def sort_value(self, row: SessionEntry, col: int) -> Any:
        """Dates, bytes and seconds sort as what they are."""
        return _sort_value(row, col)

    def tooltip(self, row: SessionEntry, col: int) -> str:
        """Why the file cannot be read, or where it is."""
        return row.error or str(row.path)


def _display(entry: SessionEntry, col: int) -> str:
    if col == 0:
        return str(entry.meta.get("created", ""))[:19].replace("T", " ") or entry.path.name
    if col == 1:
        return entry.title
    if col == 2:
        return entry.error.split(":")[0] if entry.error else entry.status
    if col == 3:
        return format_duration(entry.last_t) if entry.samples else "-"
    if col == 4:
        return format_bytes(entry.peak_bytes) if entry.peak_bytes is not None else "-"
    if col == 5:
        return str(entry.alerts)
    return format_bytes(entry.size)


def _sort_value(entry: SessionEntry, col: int) -> Any:
    return (
        str(entry.meta.get("created", "")),
        entry.title.lower(),
        entry.status,
        entry.last_t,
        entry.peak_bytes or 0,
        entry.alerts,
        entry.size,
    )[col]


class SessionsDialog(QDialog):
    """Lists the sessions folder; :attr:`open_requested` carries the file to open."""

    open_requested = Signal(str)
    #: Two or more session files to put side by side.
    compare_requested = Signal(list)

    def __init__(self, parent: QWidget | None = None, folder: Path | None = None) -> None:
        super().__init__(parent)
        self.folder = folder or sessions_dir()
        self.setWindowTitle("Recorded sessions")
        self.resize(900, 420)
        self.model = SessionModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(0, Qt.DescendingOrder)
        self.view.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.view.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.view.verticalHeader().hide()
        header = self.view.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.Stretch)
        self.view.setWordWrap(False)
        self.view.doubleClicked.connect(lambda _index: self.open_selected())
        self.where = QLabel()
        self.where.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.where.setWordWrap(True)

        buttons = QDialogButtonBox()
        self.open_button = QPushButton("&Open")
        self.open_button.setDefault(True)
        self.open_button.setToolTip("Show the selected run in the window, as it was (Enter)")
        self.rename_button = QPushButton("Re&name…")
        self.rename_button.setToolTip("Give the selected run a name of your own (F2)")
        self.delete_button = QPushButton("&Delete")
        self.delete_button.setToolTip("Delete the selected session file (Del)")
        self.compare_button = QPushButton("&Compare")
        self.compare_button.setToolTip(
            "Put the selected runs side by side: one trace of each on one plot, their peaks, "
            "step times and settings in a table (select two or more with Ctrl or Shift)"
        )
        self.file_button = QPushButton("Open &file…")
        self.file_button.setToolTip("Open a session file from elsewhere (torchmem run --record)")
        for button in (self.open_button, self.compare_button, self.rename_button):
            buttons.addButton(button, QDialogButtonBox.ActionRole)
        buttons.addButton(self.delete_button, QDialogButtonBox.ActionRole)
        buttons.addButton(self.file_button, QDialogButtonBox.ActionRole)
        buttons.addButton(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        self.open_button.clicked.connect(self.open_selected)
        self.compare_button.clicked.connect(self.compare_selected)
        self.rename_button.clicked.connect(self.rename_selected)
        self.delete_button.clicked.connect(self.delete_selected)
        self.file_button.clicked.connect(self.open_file)
        QShortcut(QKeySequence.Delete, self.view, activated=self.delete_selected)
        QShortcut(QKeySequence(Qt.Key_F2), self.view, activated=self.rename_selected)

        layout = QVBoxLayout(self)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.where)
        layout.addWidget(buttons)
        self.view.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        self.refresh()

    # -- rows -----------------------------------------------------------------------------
    @Slot()
    def refresh(self) -> None:
        """Read the folder again."""
        rows = list_sessions(self.folder)
        self.model.set_rows(rows)
        total = sum(e.size for e in rows)
        self.where.setText(
            f"{len(rows)} session{'s' if len(rows) != 1 else ''}, {format_bytes(total)} in "
            f"{self.folder}. The oldest go first beyond the size cap; every run in the "
            "window is recorded while Run > Record every run is on."
        )
        if rows:
            self.view.selectRow(0)
        self._update_buttons()

    def selected_entries(self) -> list[SessionEntry]:
        """The entries of the selected rows, in the order shown."""
        rows = sorted(self.view.selectionModel().selectedRows(), key=lambda i: i.row())
        return [self.model.rows[self.proxy.mapToSource(i).row()] for i in rows]

    def selected(self) -> SessionEntry | None:
        """The entry of the selected row (the first, when several are)."""
        entries = self.selected_entries()
        return entries[0] if entries else None

    def _update_buttons(self) -> None:
        entries = self.selected_entries()
        one = len(entries) == 1 and not entries[0].error
        self.open_button.setEnabled(one)
        self.rename_button.setEnabled(one)
        self.delete_button.setEnabled(len(entries) == 1)
        readable = [e for e in entries if not e.error]
        self.compare_button.setEnabled(len(readable) >= 2)

    # -- actions --------------------------------------------------------------------------
    @Slot()
    def open_selected(self) -> None:
        """Ask the window to show the selected session."""
        entry = self.selected()
        if entry is None:
            return
        if entry.error:
            QMessageBox.warning(self, "Cannot open the session", entry.error)
            return
        self.open_requested.emit(str(entry.path))
        self.accept()

    @Slot()
    def compare_selected(self) -> None:
        """Ask the window to compare the selected runs (two or more)."""
        paths = [str(e.path) for e in self.selected_entries() if not e.error]
        if len(paths) < 2:
            return
        self.compare_requested.emit(paths)
        self.accept()

    @Slot()
    def open_file(self) -> None:
        """Choose a session file anywhere."""
        path, _ = QFileDialog.getOpenFileName(
            self, "Open a recorded session", str(self.folder),
            f"torchmem sessions (*{SUFFIX});;All files (*)",
        )  # fmt: skip
        if path:
            self.open_requested.emit(path)
            self.accept()

    @Slot()
    def rename_selected(self) -> None:
        """Give the selected run a title (stored in the file; the file keeps its name)."""
        entry = self.selected()
        if entry is None or entry.error:
            return
        title, ok = QInputDialog.getText(self, "Rename the run", "Name:", text=entry.title)
        if not ok or not title.strip():
            return
        try:
            rename_session(entry.path, title.strip())
        except RecordError as exc:
            QMessageBox.warning(self, "Cannot rename the session", str(exc))
        self.refresh()

    @Slot()
    def delete_selected(self) -> None:
        """Delete the selected session file after asking."""
        entry = self.selected()
        if entry is None:
            return
        answer = QMessageBox.question(
            self, "Delete the session",
            f"Delete the recording of {entry.title} ({format_bytes(file_bytes(entry.path))})? "
            "This cannot be undone.",
        )  # fmt: skip
        if answer != QMessageBox.Yes:
            return
        try:
            for suffix in ("", "-wal", "-shm"):
                entry.path.with_name(entry.path.name + suffix).unlink(missing_ok=True)
        except OSError as exc:
            QMessageBox.warning(self, "Cannot delete the session", str(exc))
        self.refresh()
