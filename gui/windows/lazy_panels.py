"""The Tune and Lab panels, made the first time they are shown.

Most sessions never tune or measure an operation, and every window would otherwise
build and carry both panels' widgets (and import their modules at start-up). Each dock
holds a placeholder until it is first shown; the panel is then made, put in the dock and
kept. The window reaches them as ``window.panels.tune`` and ``window.panels.lab``.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtWidgets import QApplication, QDockWidget

from torchmem.gui.theme import follow_palette

if TYPE_CHECKING:
    from torchmem.gui.panels.lab_panel import LabPanel
    from torchmem.gui.panels.tune_panel import TunePanel
    from torchmem.gui.windows.main_window import MainWindow


class LazyPanels(QObject):
    """The window's Tune and Lab panels, made on first use; shut down with the window."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self._tune: TunePanel | None = None
        self._lab: LabPanel | None = None

    @property
    def tune(self) -> TunePanel:
        """The Tune panel, made on first use."""
        if self._tune is None:
            from torchmem.gui.panels.tune_panel import TunePanel

            self._tune = TunePanel()
            self._tune.use_batch_size.connect(self._use_batch_size)
            self.window.tune_dock.setWidget(self._tune)
        return self._tune

    @property
    def lab(self) -> LabPanel:
        """The Lab panel, made on first use."""
        if self._lab is None:
            from torchmem.gui.panels.lab_panel import LabPanel

            self._lab = LabPanel()
            self.window.lab_dock.setWidget(self._lab)
        return self._lab

    @Slot(bool)
    def on_tune_visible(self, visible: bool) -> None:
        """The Tune dock was shown (a tab clicked): made, with the window's script."""
        if visible:
            self.tune.set_script(self.window.script, self.window.script_args)

    @Slot(bool)
    def on_lab_visible(self, visible: bool) -> None:
        """The Lab dock was shown: made."""
        if visible:
            _ = self.lab

    def open_lab(self) -> None:
        """Show the Lab panel."""
        self._open(self.window.lab_dock)
        self.lab.op_list.setFocus()

    def open_tune(self) -> None:
        """Show the Tune panel, with the current script and its arguments."""
        self.tune.set_script(self.window.script, self.window.script_args)
        self._open(self.window.tune_dock)
        self.tune.script_edit.setFocus()

    def _open(self, dock: QDockWidget) -> None:
        """Show ``dock`` with room to work in: half the window's height where it had less.
        Under the traces it kept the Log's height, and a tuning's plot and table got two
        rows each (1400x900 window). A dock the user made taller stays as it is."""
        dock.show()
        dock.raise_()
        if dock.isFloating():
            return
        wanted = self.window.height() // 2
        if dock.height() < wanted:
            self.window.resizeDocks([dock], [wanted], Qt.Vertical)

    @Slot(str, list)
    def _use_batch_size(self, script: str, args: list) -> None:
        if self.window.load_script(script, args):
            self.window.statusBar().showMessage(
                f"Arguments set to {shlex.join(args)}: F5 runs the script with them", 15000
            )

    def apply_palette(self) -> None:
        """Follow a new theme (the panels made so far)."""
        palette = QApplication.instance().palette()
        if self._tune is not None:
            self._tune.plot.setPalette(palette)
            self._tune.plot.apply_palette()
        if self._lab is not None:
            self._lab.plots.setPalette(palette)
            follow_palette(self._lab.plots)

    def shutdown(self, timeout_ms: int) -> bool:
        """End a search or a measurement still running; True when both ended in time."""
        tuned = self._tune is None or self._tune.shutdown(timeout_ms)
        measured = self._lab is None or self._lab.shutdown(timeout_ms)
        return tuned and measured
