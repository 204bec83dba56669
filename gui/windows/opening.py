"""How files come into the window: the Open dialogs, the recent scripts, dropped files.

A script is made the window's script (and run), a recorded session reopens, and anything
else is read as a PyTorch memory snapshot. The ten scripts run last are remembered in the
settings and listed in File > Open recent (those that still exist).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog

from torchmem.gui.settings_values import string_list
from torchmem.record.store import SUFFIX as SESSION_SUFFIX

if TYPE_CHECKING:
    from torchmem.gui.windows.main_window import MainWindow

#: Scripts listed in File > Open recent.
RECENT = 10


class Opening(QObject):
    """The window's ways to open a script, a session or a snapshot."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window

    def open_script_dialog(self) -> None:
        """Ask for a script and run it."""
        script = self.window.script
        start = str(Path(script).parent) if script else str(Path.cwd())
        path, _ = QFileDialog.getOpenFileName(
            self.window, "Open a training script", start, "Python scripts (*.py);;All files (*)"
        )
        if path:
            self.window.load_script(path, run=True)

    def open_snapshot_dialog(self) -> None:
        """Choose a memory snapshot and open it in a Snapshot window."""
        path, _ = QFileDialog.getOpenFileName(
            self.window, "Open memory snapshot", "", "Snapshots (*.pickle *.pkl);;All files (*)"
        )
        if path:
            self.window.snapshots.open(path)

    def open_demo(self) -> None:
        """Load and run the bundled demo."""
        from torchmem.resources import demo_script

        self.window.load_script(str(demo_script()), [], run=True)

    def open_dropped(self, path: str) -> None:
        """Open a dropped file by its kind: a script, a recorded session, or a snapshot."""
        if path.endswith(".py"):
            self.window.load_script(path, [])
        elif path.endswith(SESSION_SUFFIX):
            self.window.recordings.open(path)
        else:
            self.window.snapshots.open(path)

    def refresh_recent(self) -> None:
        """List the recent scripts that still exist in File > Open recent."""
        menu = self.window.recent_menu
        menu.clear()
        recent = [r for r in string_list(self.window.settings, "recent") if Path(r).exists()]
        for entry in recent[:RECENT]:
            menu.addAction(entry, lambda p=entry: self.window.load_script(p, run=True))
        menu.setEnabled(bool(recent))

    def remember(self, script: str) -> None:
        """Put ``script`` first among the recent scripts."""
        settings = self.window.settings
        recent = [r for r in string_list(settings, "recent") if r != script]
        settings.setValue("recent", [script, *recent][:RECENT])
        self.refresh_recent()
