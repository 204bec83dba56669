"""The Out of memory dialog: what the failed allocation asked for, what held the memory
(named, from the census taken in the error's frames), and what to try, with buttons."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from torchmem.gui.forms import read_only_table
from torchmem.leaks.oom import OomReport
from torchmem.tensors.model import KIND_LABELS
from torchmem.units import format_bytes

#: The allocator setting the expandable_segments suggestion copies.
EXPANDABLE = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
#: Button text of the suggestions a click can act on.
ACTIONS = {
    "tune": "Tune the batch size…",
    "expandable_segments": "Copy the setting",
    "leak": "Show the leak alert",
}


class OomDialog(QDialog):
    """Shows an :class:`~torchmem.leaks.oom.OomReport`; :attr:`action_requested` carries
    the key of a suggestion's button (``tune``, ``leak``) for the window to act on."""

    action_requested = Signal(str)

    def __init__(self, report: OomReport, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.report = report
        self.setWindowTitle(f"Out of memory on {report.device}")
        self.resize(760, 560)
        headline = QLabel(f"<b>The run ran out of memory on {report.device}.</b>")
        message = QLabel(report.message)
        message.setWordWrap(True)
        message.setTextInteractionFlags(Qt.TextSelectableByMouse)

        figures = QFormLayout()
        rows = (
            ("Asked for", report.requested_bytes, "what the failed allocation asked for"),
            ("Process RSS" if report.device == "cpu" else "Allocated", report.allocated_bytes,
             "the process's resident memory at its peak (CPU tensors live there)"
             if report.device == "cpu" else "memory in use by tensors, at its peak"),
            ("Reserved", report.reserved_bytes,
             "memory the caching allocator held: allocated plus its cache"),
            ("Reserved but unallocated", report.unallocated_reserved,
             "held by the allocator but in no tensor: fragmentation, when large"),
            ("Inactive split blocks", report.inactive_split_bytes,
             "cached blocks the allocator split and could not hand out whole"),
            ("Device total", report.capacity_bytes, "the device's memory"),
        )  # fmt: skip
        for label, value, tip in rows:
            if value is None:
                continue
            field = QLabel(format_bytes(value))
            field.setToolTip(tip)
            figures.addRow(f"{label}:", field)
        if report.by_kind:
            kinds = ", ".join(
                f"{KIND_LABELS.get(k, k)} {format_bytes(v)}"
                for k, v in sorted(report.by_kind.items(), key=lambda kv: -kv[1])
                if v
            )
            by_kind = QLabel(kinds)
            by_kind.setWordWrap(True)
            figures.addRow("Tensors by kind:", by_kind)

        self.table = read_only_table(["Size", "Tensor", "Kind"], stretch=1)
        self.table.setRowCount(len(report.largest))
        for r, (name, kind, nbytes) in enumerate(report.largest):
            size = QTableWidgetItem(format_bytes(nbytes))
            size.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            self.table.setItem(r, 0, size)
            self.table.setItem(r, 1, QTableWidgetItem(name))
            self.table.setItem(r, 2, QTableWidgetItem(KIND_LABELS.get(kind, kind)))
        where = (
            "Largest storages when it failed (a census of the error's frames):"
            if report.census_trigger == "oom"
            else "Largest storages at the last census:"
        )

        layout = QVBoxLayout(self)
        layout.addWidget(headline)
        layout.addWidget(message)
        layout.addLayout(figures)
        if report.largest:
            layout.addWidget(QLabel(where))
            layout.addWidget(self.table, 1)
        layout.addWidget(QLabel("<b>What to try</b>"))
        self.buttons: dict[str, QPushButton] = {}
        for suggestion in report.suggestions:
            row = QHBoxLayout()
            text = QLabel(f"• {suggestion.text}")
            text.setWordWrap(True)
            row.addWidget(text, 1)
            if suggestion.key in ACTIONS:
                button = QPushButton(ACTIONS[suggestion.key])
                button.clicked.connect(lambda _=False, key=suggestion.key: self._act(key))
                self.buttons[suggestion.key] = button
                row.addWidget(button)
            layout.addLayout(row)
        close = QDialogButtonBox(QDialogButtonBox.Close)
        close.rejected.connect(self.reject)
        layout.addWidget(close)

    @Slot(str)
    def _act(self, key: str) -> None:
        if key == "expandable_segments":
            QGuiApplication.clipboard().setText(EXPANDABLE)
            self.buttons[key].setText("Copied")
            return
        self.action_requested.emit(key)
