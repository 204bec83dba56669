"""The main window's docks, toolbar, menus and status bar, built from tables.

The window composes views and reacts to runs; what surrounds the views is data here, as
``actions.py`` is for the actions: a dock, a menu entry or a toolbar button is one row. The
builders set the widgets they make as attributes of the window (``window.log_dock``,
``window.unit_combo``), the names its code, settings and tests use.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (
    QComboBox,
    QDockWidget,
    QLabel,
    QLineEdit,
    QSpinBox,
    QToolBar,
    QWidget,
)

from torchmem.events import RunStatus
from torchmem.gui.actions import ACTIONS
from torchmem.gui.theme import THEMES
from torchmem.gui.view_state import UNIT_CHOICES, WINDOWS
from torchmem.gui.windows.status_bar import ElidingStatusBar
from torchmem.probe.sampler import MAX_HZ, MIN_HZ

if TYPE_CHECKING:
    from torchmem.gui.windows.main_window import MainWindow


class DockSpec(NamedTuple):
    """One dock: ``window.<attr>_dock`` holding ``window.<attr>`` (or a placeholder label
    for a panel made on first show)."""

    attr: str
    title: str
    area: Qt.DockWidgetArea
    tip: str = ""
    #: The dock it shares tabs with (already built).
    tab_with: str | None = None
    #: Shown until the panel is made (it is made the first time its dock shows).
    placeholder: str | None = None


#: The docks in the order they are added (the order tabs and the View menu follow).
DOCKS = (
    DockSpec("log", "Log", Qt.BottomDockWidgetArea),
    DockSpec("tensors", "Tensors", Qt.BottomDockWidgetArea, tab_with="log"),
    DockSpec("alerts", "Alerts", Qt.BottomDockWidgetArea, tab_with="tensors"),
    DockSpec(
        "breakdown",
        "Breakdown by kind",
        Qt.RightDockWidgetArea,
        "Unique tensor bytes by kind at each census: parameters, gradients, optimizer "
        "state, activations, buffers, other",
    ),
    DockSpec(
        "tune",
        "Tune",
        Qt.BottomDockWidgetArea,
        "Find the largest batch size that fits a memory budget",
        tab_with="alerts",
        placeholder="Run > Tune the batch size… (Ctrl+B)",
    ),
    DockSpec(
        "lab",
        "Lab",
        Qt.BottomDockWidgetArea,
        "Measure what tensor operations cost in memory and time",
        tab_with="tune",
        placeholder="Memory > Memory lab… (Ctrl+L)",
    ),
    DockSpec("readings", "Readings", Qt.RightDockWidgetArea),
)

#: Each menu's entries: an action's attribute, ``None`` for a separator, ``"recent"`` for
#: the recent-scripts menu, ``"docks"`` for every dock's toggle, ``"theme"`` for themes.
MENUS: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (
        "&File",
        ("act_open", "act_demo", "recent", None, "act_sessions", "act_open_snapshot",
         "act_export", None, "act_quit"),
    ),
    (
        "&Run",
        ("act_run", "act_stop", "act_rerun", "act_abandon", "act_isolated", "act_allocator",
         "act_record", "act_tune", None, "act_attach", "act_inject", "act_detach"),
    ),
    (
        "&Memory",
        ("act_gc", "act_empty", "act_reset", None, "act_history", "act_snapshot", None,
         "act_census", "act_census_diff", "act_oom", "act_leak_settings", None, "act_lab"),
    ),
    ("&View", ("act_steps", "act_follow", "act_pause", None, "docks", "theme")),
    ("&Help", ("act_shortcuts", "act_about")),
)  # fmt: skip

#: The main toolbar: actions, ``None`` for a separator, and the widgets made here.
TOOLBAR = (
    "act_open", "act_run", "act_stop", "act_rerun", "act_attach", "args", None,
    "act_gc", "act_empty", "act_reset", None,
    "act_steps", "act_follow", "act_pause", "window", "unit", "rank",
)  # fmt: skip


def shortcuts_table(window: QWidget) -> str:
    """The shortcuts of ``window``'s actions as a rich-text table: a key column padded
    from its description (the cells otherwise touch: "Ctrl+Shift+OOpen a snapshot")."""
    rows = sorted(
        (a.shortcut().toString(QKeySequence.NativeText), a.text().replace("&", ""))
        for a in window.findChildren(QAction)
        if not a.shortcut().isEmpty()
    )
    cells = "".join(
        f"<tr><td style='padding-right:18px'><b>{key}</b></td><td>{what}</td></tr>"
        for key, what in rows
    )
    return f"<table cellspacing='2'>{cells}</table>"


def make_action(
    window: QWidget,
    text: str,
    slot: Callable[..., object],
    shortcut: str | None = None,
    tip: str = "",
    checkable: bool = False,
) -> QAction:
    """A QAction of ``window``; its tooltip names its shortcut."""
    act = QAction(text, window)
    if shortcut:
        act.setShortcut(QKeySequence(shortcut))
    if tip:
        keys = act.shortcut().toString(QKeySequence.NativeText)
        act.setToolTip(f"{tip} ({keys})" if shortcut else tip)
        act.setStatusTip(tip)
    act.setCheckable(checkable)
    if checkable:
        act.triggered.connect(slot)
    else:
        # QAction.triggered carries ``checked=False``: passed on, it would land in the
        # slot's first parameter (it once turned Stop's ``confirm`` off). Call plainly.
        act.triggered.connect(lambda _checked=False, slot=slot: slot())
    return act


def build_actions(window: MainWindow) -> None:
    """Every row of :data:`ACTIONS` as ``window.<attr>``."""
    for spec in ACTIONS:
        if spec.slot.startswith("command:"):
            name = spec.slot.removeprefix("command:")
            handler = lambda name=name: window.run_command(name)  # noqa: E731
        else:
            handler = attrgetter(spec.slot)(window)  # "recordings.open_dialog" too
        action = make_action(window, spec.text, handler, spec.shortcut, spec.tip, spec.checkable)
        setattr(window, spec.attr, action)


def build_docks(window: MainWindow) -> None:
    """Every row of :data:`DOCKS` as ``window.<attr>_dock``, the Log's tab in front."""
    for spec in DOCKS:
        dock = QDockWidget(spec.title, window)
        dock.setObjectName(f"{spec.attr}_dock")
        dock.setWidget(QLabel(spec.placeholder) if spec.placeholder else getattr(window, spec.attr))
        if spec.tip:
            dock.setToolTip(spec.tip)
        window.addDockWidget(spec.area, dock)
        if spec.tab_with:
            window.tabifyDockWidget(getattr(window, f"{spec.tab_with}_dock"), dock)
        setattr(window, f"{spec.attr}_dock", dock)
    window.log_dock.raise_()


def _combo(tip: str, items: list[str]) -> QComboBox:
    combo = QComboBox()
    combo.addItems(items)
    combo.setToolTip(tip)
    return combo


def build_toolbar(window: MainWindow) -> None:
    """The main toolbar (:data:`TOOLBAR`), its script arguments, window, unit and rank
    choosers; the choosers show and write the window's view state."""
    state = window.view
    window.args_edit = QLineEdit()
    window.args_edit.setPlaceholderText("script arguments, e.g. --lr 0.1")
    window.args_edit.setToolTip("Arguments passed to the script on the next Run (shell quoting)")
    window.args_edit.setMaximumWidth(260)
    window.args_edit.returnPressed.connect(window.rerun)
    window.window_combo = _combo(
        "How much of the run Follow keeps in view", [label for label, _ in WINDOWS]
    )
    window.window_combo.setCurrentText(state.window)
    window.window_combo.currentTextChanged.connect(state.set_window)
    state.window_changed.connect(window.window_combo.setCurrentText)
    window.unit_combo = _combo("Units of the memory axes (auto picks per plot)", [*UNIT_CHOICES])
    window.unit_combo.setCurrentText(state.unit)
    window.unit_combo.currentTextChanged.connect(state.set_unit)
    state.unit_changed.connect(window.unit_combo.setCurrentText)
    window.rank_combo = _combo(
        "A torchrun job: every rank overlaid, one rank, or the job's total (the sum of "
        "each rank's latest reading). With one rank chosen, the Tensors panel shows that "
        "rank's censuses",
        [],
    )
    window.rank_combo.addItem("Every rank", None)
    window.rank_combo.currentIndexChanged.connect(
        lambda i: state.set_scope(window.rank_combo.itemData(i))
    )
    widgets = {"args": window.args_edit, "window": window.window_combo, "unit": window.unit_combo}
    tb = QToolBar("Main", window)
    tb.setObjectName("main_toolbar")
    tb.setToolButtonStyle(Qt.ToolButtonTextOnly)
    window.addToolBar(tb)
    for entry in TOOLBAR:
        if entry is None:
            tb.addSeparator()
        elif entry == "rank":
            window._rank_combo_action = tb.addWidget(window.rank_combo)
            window._rank_combo_action.setVisible(False)  # shown for a job
        elif entry in widgets:
            tb.addWidget(widgets[entry])
        else:
            tb.addAction(getattr(window, entry))


def build_menus(window: MainWindow) -> None:
    """The menu bar (:data:`MENUS`)."""
    bar = window.menuBar()
    for title, entries in MENUS:
        menu = bar.addMenu(title)
        for entry in entries:
            if entry is None:
                menu.addSeparator()
            elif entry == "recent":
                window.recent_menu = menu.addMenu("Open &recent")
            elif entry == "docks":
                for spec in DOCKS:
                    menu.addAction(getattr(window, f"{spec.attr}_dock").toggleViewAction())
            elif entry == "theme":
                themes = menu.addMenu("&Theme")
                window.theme_group = QActionGroup(window)
                for theme in THEMES:
                    act = themes.addAction(theme.capitalize())
                    act.setCheckable(True)
                    act.setData(theme)
                    window.theme_group.addAction(act)
                window.theme_group.triggered.connect(lambda act: window.set_theme(act.data()))
            else:
                menu.addAction(getattr(window, entry))


def build_status_bar(window: MainWindow, hz: float) -> None:
    """The status bar: run mode, run state, samples and the sampling rate (``hz`` now)."""
    sb = ElidingStatusBar(window)
    window.setStatusBar(sb)
    window.run_label = QLabel("No script")
    window.run_label.setToolTip("State of the script run")
    window.samples_label = QLabel("")
    window.samples_label.setToolTip("Samples recorded in this run")
    window.rate_spin = QSpinBox()
    window.rate_spin.setRange(int(MIN_HZ), int(MAX_HZ))
    window.rate_spin.setSuffix(" Hz")
    window.rate_spin.setValue(int(round(hz)))
    window.rate_spin.setToolTip("Sampling rate (1-100 Hz). Counters only: no device sync.")
    window.mode_label = QLabel("Separate process")
    window.mode_label.setToolTip(
        "Scripts run in a separate process (Run > Run in a separate process, remembered "
        "between launches). Uncheck it to run them in a background thread of this window."
    )
    window.mode_label.setVisible(False)
    for widget in (window.mode_label, window.run_label, window.samples_label, window.rate_spin):
        sb.addPermanentWidget(widget)


def sync_actions(window: MainWindow) -> None:
    """Enable and check the window's actions as its run, attach and recording stand now."""
    running = window.running
    window.act_run.setEnabled(not running and window.script is not None)
    window.act_stop.setEnabled(running and not window.stopping)
    window.act_abandon.setEnabled(window.runs.can_abandon)
    window.act_rerun.setEnabled(window.script is not None and window.attached is None)
    window.act_attach.setEnabled(not running)
    window.act_detach.setEnabled(window.attached is not None)
    window.act_inject.setEnabled(
        window.attached is not None and window.attached.watch is not None and running
    )
    local = window.attached is None
    window.act_leak_settings.setEnabled(local)
    window.act_leak_settings.setToolTip(
        "Thresholds and warm-up of leak and capacity alerts"
        if local
        else "An attached process raises alerts with its own (default) settings"
    )
    window.act_isolated.setEnabled(not running)
    finished = window.session.run_finished
    window.act_oom.setEnabled(
        not running and finished is not None and finished.status is RunStatus.OOM
    )
    has_acc = window.runs.target.has_accelerator
    for act in (window.act_history, window.act_snapshot):
        act.setEnabled(has_acc)
    window.act_empty.setEnabled(has_acc)
    window.act_empty.setToolTip(
        "Return the accelerator allocator's unused cache to the device (Ctrl+E)"
        if has_acc
        else "No accelerator (CUDA, MPS, XPU) in this process: nothing to empty"
    )
    if not running and window.script is None and window.session.samples == 0:
        window.run_label.setText("No script: Ctrl+O to open one, Ctrl+Shift+A to attach")
