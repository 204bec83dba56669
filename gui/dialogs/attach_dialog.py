"""The Attach dialog: live agents and other torch processes of the user, to attach to,
on this machine or on an SSH host (recent hosts and their torchmem command remembered)."""

from __future__ import annotations

from PySide6.QtCore import (
    QObject,
    QSettings,
    QTimer,
    Signal,
    Slot,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from torchmem.gui.row_table import RowTableModel
from torchmem.gui.settings_values import string_list
from torchmem.gui.workers import start_in_thread, wait_thread
from torchmem.sources.processes import ProcessInfo, list_processes
from torchmem.transport.client import AttachError
from torchmem.transport.ssh import SshHost, remote_processes
from torchmem.units import format_bytes

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


class ProcessModel(RowTableModel):
    """Rows of :class:`~torchmem.sources.processes.ProcessInfo`."""

    columns, tips = COLUMNS, TIPS
    right_aligned = frozenset({0, 3, 4})

    def display(self, row: ProcessInfo, col: int) -> str:
        """The cell's text."""
        agent = row.agent
        return (
            str(row.pid),
            "yes" if agent else "no",
            f"{agent.rank}/{agent.world_size}" if agent and agent.rank is not None else "",
            format_bytes(row.rss),
            format_bytes(row.gpu_bytes) if row.gpu_bytes is not None else "",
            " ".join(row.cmdline),
        )[col]

    def tooltip(self, row: ProcessInfo, col: int) -> str | None:
        """The whole command line in its column (it is elided there)."""
        return " ".join(row.cmdline) if col == 5 else super().tooltip(row, col)


THIS_MACHINE = "This machine"
RECENT_HOSTS = "attach/recent_hosts"
MAX_RECENT = 8
#: Another machine is listed on demand (Refresh, a host chosen), not every 3 s: each
#: listing is an SSH connection.
LOCAL_REFRESH_MS = 3000


class ProcessLister(QObject):
    """Lists processes off the GUI thread: it reads every candidate's memory map, or asks
    a host over SSH (seconds when the host is slow to answer)."""

    listed = Signal(str, list)  # the host ("" here), its rows
    failed = Signal(str, str)  # the host, what went wrong and what to do

    @Slot(str, str)
    def refresh(self, host: str, command: str) -> None:
        """List the processes of ``host`` ("" for this machine) and emit them."""
        if not host:
            try:
                rows = list_processes()
            except Exception:  # a vanished /proc entry mid-scan must not kill the thread
                rows = []
            self.listed.emit(host, rows)
            return
        try:
            found = remote_processes(SshHost(host, command or None))
            rows = [ProcessInfo.from_json(row, host) for row in found]
        except AttachError as exc:
            self.failed.emit(host, str(exc))
            return
        except Exception as exc:  # a malformed row of another version: said, not fatal
            self.failed.emit(host, f"{type(exc).__name__}: {exc}")
            return
        self.listed.emit(host, rows)


class AttachDialog(QDialog):
    """Pick a process to attach to; after ``exec()``, ``chosen_pid`` holds the choice and
    ``chosen_host`` the SSH host it runs on (None: this machine)."""

    refresh_requested = Signal(str, str)

    def __init__(self, parent: QWidget | None = None, settings: QSettings | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Attach to a running process")
        self.resize(860, 420)
        self.chosen_pid: int | None = None
        self.chosen_host: SshHost | None = None
        self._listed_host: str | None = None  # the machine the table lists
        self._settings = settings or QSettings()
        self.host_combo = QComboBox()
        self.host_combo.setEditable(True)
        self.host_combo.setInsertPolicy(QComboBox.NoInsert)
        self.host_combo.addItem(THIS_MACHINE)
        for host in self._recent_hosts():
            self.host_combo.addItem(host)
        self.host_combo.lineEdit().setPlaceholderText("user@node1, or an alias of ~/.ssh/config")
        self.host_combo.setToolTip(
            "Where the process runs: this machine, or a host reached with your own ssh "
            "(keys, ~/.ssh/config, ProxyJump). Nothing listens on the network: the agent's "
            "socket is forwarded over SSH. Type a host and press Enter to list it."
        )
        self.host_combo.activated.connect(self._on_host_chosen)
        self.host_combo.lineEdit().returnPressed.connect(self._on_return_in_host)
        self.command_edit = QLineEdit()
        self.command_edit.setPlaceholderText("torchmem, then python3 -m torchmem")
        self.command_edit.setToolTip(
            "How torchmem is run on that host, e.g. /path/to/venv/bin/torchmem on a "
            "cluster. Remembered per host."
        )
        self.command_edit.setEnabled(False)
        self.command_edit.editingFinished.connect(self._on_host_chosen)
        where = QFormLayout()
        where.addRow("&Machine:", self.host_combo)
        where.addRow("torchmem &command there:", self.command_edit)
        self.model = ProcessModel(self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(5, QHeaderView.Stretch)
        # Return on a row, or a double-click (a single click where the platform says so).
        self.table.activated.connect(self.accept)
        self.status = QLabel("Looking for processes…")
        self.status.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.attach_button = buttons.button(QDialogButtonBox.Ok)
        self.attach_button.setText("&Attach")
        self.attach_button.setEnabled(False)
        refresh = QPushButton("&Refresh")
        refresh.setToolTip("List the processes again (on this machine also every 3 s)")
        refresh.clicked.connect(self.refresh)
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
        layout.addLayout(where)
        layout.addWidget(hint)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.status)
        layout.addWidget(buttons)
        self.table.selectionModel().selectionChanged.connect(self._on_selection)

        self._lister = ProcessLister()
        self._thread = start_in_thread(self._lister, "torchmem-process-list")
        self.refresh_requested.connect(self._lister.refresh)
        self._lister.listed.connect(self._on_listed)
        self._lister.failed.connect(self._on_failed)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self._on_timer)
        self._timer.start(LOCAL_REFRESH_MS)
        self.refresh()

    # -- the machine ------------------------------------------------------------------------
    def host(self) -> str:
        """The host typed or chosen ("" for this machine)."""
        text = self.host_combo.currentText().strip()
        return "" if text in ("", THIS_MACHINE) else text

    def _recent_hosts(self) -> list[str]:
        return string_list(self._settings, RECENT_HOSTS)[:MAX_RECENT]

    def _remember(self, host: str, command: str) -> None:
        hosts = [host, *[h for h in self._recent_hosts() if h != host]][:MAX_RECENT]
        self._settings.setValue(RECENT_HOSTS, hosts)
        self._settings.setValue(f"attach/command/{host}", command)

    @Slot()
    def _on_return_in_host(self) -> None:
        """Return in the machine field: attach to the selected process when the listing
        is of the machine typed (Return attaches, as the OK button's shortcut); list a
        newly typed machine otherwise."""
        if self.host() == self._listed_host and self.attach_button.isEnabled():
            self.accept()
        else:
            self._on_host_chosen()

    @Slot()
    def _on_host_chosen(self) -> None:
        host = self.host()
        self.command_edit.setEnabled(bool(host))
        if host and self.sender() is not self.command_edit:
            self.command_edit.setText(str(self._settings.value(f"attach/command/{host}", "")))
        self.model.set_rows([])
        self._listed_host = None
        self.refresh()

    @Slot()
    def refresh(self) -> None:
        """List the processes of the chosen machine again."""
        host = self.host()
        if host:
            self.status.setText(f"Asking {host} over SSH…")
        self.refresh_requested.emit(host, self.command_edit.text().strip())

    @Slot()
    def _on_timer(self) -> None:
        if not self.host():
            self.refresh()

    @Slot(str, str)
    def _on_failed(self, host: str, message: str) -> None:
        if host != self.host():
            return  # the user has moved on to another machine
        self.model.set_rows([])
        self.status.setText(f"<span style='color:#c0392b'>{message}</span>")
        self._on_selection()

    @Slot(str, list)
    def _on_listed(self, host: str, rows: list[ProcessInfo]) -> None:
        if host != self.host():
            return  # a listing of the machine chosen before
        selected = self.selected_pid()
        rows = sorted(rows, key=lambda r: (r.agent is None, r.pid))  # attachable ones first
        self.model.set_rows(rows)
        self._listed_host = host
        agents = sum(1 for r in rows if r.agent)
        where = f" on {host}" if host else ""
        nothing = (
            f"No torch process of yours is running{where}. Start one with `torchmem run "
            "--attachable SCRIPT`, or add torchmem.serve() to a script."
        )
        listed = f"{len(rows)} process{'es' * (len(rows) != 1)}{where}, {agents} with an agent."
        if host and len(rows) > agents:
            listed += " Over SSH only processes with an agent can be attached to."
        self.status.setText(listed if rows else nothing)
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

    def _selected_row(self) -> ProcessInfo | None:
        rows = self.table.selectionModel().selectedRows()
        return self.model.rows[rows[0].row()] if rows else None

    @Slot()
    def _on_selection(self) -> None:
        row = self._selected_row()
        # Over SSH, a process is reached through its agent only.
        usable = row is not None and (row.agent is not None or not self.host())
        self.attach_button.setEnabled(usable)

    def accept(self) -> None:
        """Attach to the selected process."""
        if not self.attach_button.isEnabled():
            return
        self.chosen_pid = self.selected_pid()
        host = self.host()
        if self.chosen_pid is None:
            return
        if host:
            command = self.command_edit.text().strip()
            try:
                self.chosen_host = SshHost(host, command or None)
            except AttachError as exc:
                self._on_failed(host, str(exc))
                return
            self._remember(host, command)
        super().accept()

    def done(self, result: int) -> None:
        """Stop the lister thread before the dialog goes."""
        self._timer.stop()
        self._thread.quit()
        wait_thread(self._thread, 5000)
        super().done(result)
