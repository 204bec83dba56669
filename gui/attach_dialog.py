"""The Attach dialog: live agents and other torch processes of the user, to attach to."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    QTimer,
    Signal,
    Slot,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from torchmem.sources.processes import ProcessInfo, list_processes
from torchmem.units import format_bytes

from .workers import start_in_thread, wait_thread

COLUMNS = ("PID", "Agent", "Rank", "RSS", "GPU", "Command")
TIPS = (
    "Process id",
    "yes: torchmem.serve() or `torchmem run --attachable` runs in it, so everything is shown "
    "(steps, tensors, alerts, commands). no: watched from outside (RSS and GPU memory only)",
    "Rank / world size of a torchrun job (attaching to the launcher attaches to every rank)",
    "Resident memory of the process",
    "GPU memory the NVIDIA driver charges to the process (CUDA context and caches included)",
    "Command line",
)


class ProcessModel(QAbstractTableModel):
    """Rows of :class:`~torchmem.sources.processes.ProcessInfo`."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.rows: list[ProcessInfo] = []

    def set_rows(self, rows: list[ProcessInfo]) -> None:
        """Replace every row (the list is small: a reset is simplest and cheap)."""
        self.beginResetModel()
        self.rows = list(rows)
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole):
        if orientation == Qt.Horizontal and 0 <= section < len(COLUMNS):
            if role == Qt.DisplayRole:
                return COLUMNS[section]
            if role == Qt.ToolTipRole:
                return TIPS[section]
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.rows):
            return None
        row, col = self.rows[index.row()], index.column()
        if role == Qt.DisplayRole:
            agent = row.agent
            return (
                str(row.pid),
                "yes" if agent else "no",
                f"{agent.rank}/{agent.world_size}" if agent and agent.rank is not None else "",
                format_bytes(row.rss),
                format_bytes(row.gpu_bytes) if row.gpu_bytes is not None else "",
                " ".join(row.cmdline),
            )[col]
        if role == Qt.ToolTipRole:
            if col == 5:
                return " ".join(row.cmdline)
            return TIPS[col]
        if role == Qt.TextAlignmentRole and col in (0, 3, 4):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        return None


class ProcessLister(QObject):
    """Lists processes off the GUI thread (it reads every candidate's memory map)."""

    listed = Signal(list)

    @Slot()
    def refresh(self) -> None:
        """List processes now and emit them."""
        try:
            rows = list_processes()
        except Exception:  # a vanished /proc entry mid-scan must not kill the thread
            rows = []
        self.listed.emit(rows)


class AttachDialog(QDialog):
    """Pick a process to attach to; ``chosen_pid`` holds the choice after ``exec()``."""

    refresh_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Attach to a running process")
        self.resize(860, 380)
        self.chosen_pid: int | None = None
        self.model = ProcessModel(self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(5, QHeaderView.Stretch)
        self.table.doubleClicked.connect(self.accept)
        self.status = QLabel("Looking for processes…")
        self.status.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.attach_button = buttons.button(QDialogButtonBox.Ok)
        self.attach_button.setText("&Attach")
        self.attach_button.setEnabled(False)
        refresh = QPushButton("&Refresh")
        refresh.setToolTip("List the processes again (also every 3 s)")
        refresh.clicked.connect(self.refresh_requested)
        buttons.addButton(refresh, QDialogButtonBox.ActionRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        hint = QLabel(
            "Processes with an agent show everything. To give a script one, add "
            "<code>torchmem.serve()</code> to it or start it with <code>torchmem run "
            "--attachable</code>; for a torchrun job, pick its launcher to see every rank."
        )
        hint.setWordWrap(True)
        layout.addWidget(hint)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.status)
        layout.addWidget(buttons)
        self.table.selectionModel().selectionChanged.connect(self._on_selection)

        self._lister = ProcessLister()
        self._thread = start_in_thread(self._lister, "torchmem-process-list")
        self.refresh_requested.connect(self._lister.refresh)
        self._lister.listed.connect(self._on_listed)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.refresh_requested)
        self._timer.start(3000)
        self.refresh_requested.emit()

    @Slot(list)
    def _on_listed(self, rows: list[ProcessInfo]) -> None:
        selected = self.selected_pid()
        rows = sorted(rows, key=lambda r: (r.agent is None, r.pid))  # attachable ones first
        self.model.set_rows(rows)
        agents = sum(1 for r in rows if r.agent)
        self.status.setText(
            f"{len(rows)} process(es), {agents} with an agent."
            if rows
            else "No torch process of yours is running. Start one with `torchmem run "
            "--attachable SCRIPT`, or add torchmem.serve() to a script."
        )
        if selected is None and rows and rows[0].agent is not None:
            selected = rows[0].pid  # the first attachable process, ready for Enter
        for i, row in enumerate(rows):
            if row.pid == selected:
                self.table.selectRow(i)
                break

    def selected_pid(self) -> int | None:
        """The pid of the selected row, if any."""
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self.model.rows[rows[0].row()].pid

    @Slot()
    def _on_selection(self) -> None:
        self.attach_button.setEnabled(self.selected_pid() is not None)

    def accept(self) -> None:
        """Attach to the selected process."""
        self.chosen_pid = self.selected_pid()
        if self.chosen_pid is not None:
            super().accept()

    def done(self, result: int) -> None:
        """Stop the lister thread before the dialog goes."""
        self._timer.stop()
        self._thread.quit()
        wait_thread(self._thread, 5000)
        super().done(result)
