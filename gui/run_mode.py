"""How the window's next runs start: in a background thread of the window or in a
separate process, and with which allocator settings (PYTORCH_CUDA_ALLOC_CONF).

Both choices are remembered between launches and shown in the status bar's mode label;
a run with allocator settings always goes to a separate process (the allocator reads
them once, as CUDA initialises, so a thread of the window could not take new ones).
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QSettings, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QInputDialog, QLabel, QWidget

from torchmem.probe.allocator import allocator_env, check_allocator_conf


class RunMode(QObject):
    """The separate-process choice (a checkable action) and the allocator settings."""

    #: A line for the status bar (the choice changed) or, with ``True``, a refusal.
    said = Signal(str, bool)

    def __init__(
        self, settings: QSettings, isolated: QAction, label: QLabel, parent: QWidget
    ) -> None:
        super().__init__(parent)
        self.settings, self.isolated_action, self.label = settings, isolated, label
        #: PYTORCH_CUDA_ALLOC_CONF of the next runs ("" for the allocator's defaults).
        self.allocator_conf = ""
        isolated.toggled.connect(lambda _checked: self._show())

    @property
    def separate(self) -> bool:
        """True when the next run goes to a separate process."""
        return self.isolated_action.isChecked() or bool(self.allocator_conf)

    def env(self) -> dict[str, str]:
        """The environment the next run's allocator settings need."""
        return allocator_env(self.allocator_conf)

    def restore(self) -> None:
        """The choices of the last session (a hand-edited setting PyTorch would not read
        is dropped)."""
        s = self.settings
        self.isolated_action.setChecked(s.value("run/isolated", False) in (True, "true"))
        try:
            self.allocator_conf = check_allocator_conf(str(s.value("run/allocator", "")))
        except ValueError:
            self.allocator_conf = ""
        self._show()

    @Slot()
    def isolated_toggled(self) -> None:
        """Remember Run > Run in a separate process, and say what it changes."""
        checked = self.isolated_action.isChecked()
        self.settings.setValue("run/isolated", checked)
        self.said.emit(
            "Next runs in a separate process"
            if checked
            else "Next runs in this process (a background thread)",
            False,
        )

    def edit_allocator(self, parent: QWidget) -> None:
        """Ask for PYTORCH_CUDA_ALLOC_CONF of the next runs; checked before it is kept."""
        text, ok = QInputDialog.getText(
            parent,
            "Allocator settings",
            "PYTORCH_CUDA_ALLOC_CONF for the next runs (empty: PyTorch's defaults).\n"
            "E.g. expandable_segments:True or max_split_size_mb:128,"
            "garbage_collection_threshold:0.8.\nRuns with settings go to a separate process.",
            text=self.allocator_conf,
        )
        if not ok:
            return
        try:
            conf = check_allocator_conf(text)
        except ValueError as exc:
            self.said.emit(f"Allocator settings not changed: {exc}", True)
            return
        self.allocator_conf = conf
        self.settings.setValue("run/allocator", conf)
        self._show()
        self.said.emit(
            f"Next runs: PYTORCH_CUDA_ALLOC_CONF={conf}, in a separate process"
            if conf
            else "Next runs: the allocator's default settings",
            False,
        )

    def _show(self) -> None:
        conf = self.allocator_conf
        self.label.setText("Separate process" + (f" · {conf}" if conf else ""))
        self.label.setVisible(self.separate)
