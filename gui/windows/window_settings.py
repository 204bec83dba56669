"""The window's settings: what it restores at start and saves at close.

Each part keeps its own (the view state, the run mode, the recordings, leak settings);
here they are read and written in one order, with the window's geometry and its dock
layout, which is saved per :data:`LAYOUT_VERSION`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, Qt

from torchmem.gui.dialogs.leak_settings import load_leak_settings

if TYPE_CHECKING:
    from torchmem.gui.windows.main_window import MainWindow

# Bumped whenever docks are added or moved: a dock layout saved by an older version would
# put new docks in odd places, so it is not restored.
LAYOUT_VERSION = 4


def restore_window(window: MainWindow) -> None:
    """Geometry, docks, view choices, rate, leak settings, run mode, recordings, the
    census switch, the theme and the recent scripts, as the last window left them (a
    first start: most of the room for the traces)."""
    s = window.settings
    geometry = s.value("window/geometry")
    if isinstance(geometry, QByteArray) and not geometry.isEmpty():
        window.restoreGeometry(geometry)
    else:
        window.resize(1360, 860)
    state = s.value(f"window/state-v{LAYOUT_VERSION}")
    if isinstance(state, QByteArray) and not state.isEmpty():
        window.restoreState(state)
    else:  # first start: most of the room for the traces
        window.resizeDocks([window.readings_dock], [330], Qt.Horizontal)
        window.resizeDocks([window.log_dock], [330], Qt.Vertical)
        # The breakdown needs height to read; the readings table a few rows.
        window.resizeDocks([window.breakdown_dock, window.readings_dock], [330, 260], Qt.Vertical)
    window.view.restore(s)
    window.rate_spin.setValue(int(s.value("sampler/hz", 10)))
    window.source.configure_leaks(load_leak_settings(s))
    window.run_mode.restore()
    window.recordings.restore(s)
    auto = s.value("census/auto", True)
    window.tensors.auto_check.setChecked(auto not in (False, "false"))
    theme = s.value("view/theme", "system")
    for act in window.theme_group.actions():
        act.setChecked(act.data() == theme)
    window.opening.refresh_recent()


def save_window(window: MainWindow) -> None:
    """Remember geometry, docks and view choices for the next start."""
    s = window.settings
    s.setValue("window/geometry", window.saveGeometry())
    s.setValue(f"window/state-v{LAYOUT_VERSION}", window.saveState())
    window.view.save(s)
    s.setValue("sampler/hz", window.rate_spin.value())
    s.sync()
