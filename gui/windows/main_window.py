"""torchmem's main window: the views of one Session, its actions, and the run as shown."""

from __future__ import annotations

import gc
import shlex
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer, Slot
from PySide6.QtGui import (
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QIcon,
)
from PySide6.QtWidgets import (
    QApplication,
    QMainWindow,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from torchmem import __version__
from torchmem.events import (
    RunFinished,
)
from torchmem.gui.bridge import SessionBridge
from torchmem.gui.dialogs.leak_settings import LeakSettingsDialog
from torchmem.gui.gui_gc import GuiThreadCollector
from torchmem.gui.panels.alert_panel import AlertPanel
from torchmem.gui.panels.log_pane import LogPane
from torchmem.gui.panels.readings import ReadingsTable
from torchmem.gui.panels.tensor_panel import TensorPanel
from torchmem.gui.plots.breakdown_plot import BreakdownPlot
from torchmem.gui.plots.trace_plot import TracePlot
from torchmem.gui.run_controller import RunController
from torchmem.gui.run_mode import RunMode
from torchmem.gui.theme import apply_theme
from torchmem.gui.view_state import ViewState
from torchmem.gui.windows.attaching import Attaching
from torchmem.gui.windows.banner import Banner
from torchmem.gui.windows.lazy_panels import LazyPanels
from torchmem.gui.windows.opening import Opening
from torchmem.gui.windows.recordings import Recordings
from torchmem.gui.windows.run_report import RunReport
from torchmem.gui.windows.snapshot_window import SnapshotOpener
from torchmem.gui.windows.window_chrome import (
    build_actions,
    build_docks,
    build_menus,
    build_status_bar,
    build_toolbar,
    shortcuts_table,
    sync_actions,
)
from torchmem.gui.windows.window_settings import restore_window, save_window
from torchmem.probe.commands import COMMANDS
from torchmem.probe.runner import ScriptError, validate_script
from torchmem.resources import path as resource_path
from torchmem.series import scope_label
from torchmem.session import Session
from torchmem.sources.attached import AttachedRun
from torchmem.sources.inprocess import InProcessSource


class MainWindow(QMainWindow):
    """The torchmem window: the views of one Session, and the actions on its runs."""

    def __init__(
        self, source: InProcessSource | None = None, settings: QSettings | None = None
    ) -> None:
        super().__init__()
        self.settings = settings or QSettings()
        self.session = source.session if source else Session()
        #: The run lifecycle: sources, threads, stop / stuck / abandon / re-run.
        self.runs = RunController(source or InProcessSource(self.session, lazy=True), self)
        self.source = self.runs.source
        self.bridge = SessionBridge(self.session, self)
        self.script: str | None = None
        self.script_args: list[str] = []
        self.cwd: str | None = None
        self.force_exit_needed = False
        #: What the window says of a run's start, end, alerts and command results.
        self.report = RunReport(self)

        self.setWindowTitle("torchmem")
        self.setWindowIcon(QIcon(str(resource_path("icon.svg"))))
        #: Recording each run, the Sessions dialog, reopening, comparing, exporting.
        self.recordings = Recordings(self)
        self.snapshots = SnapshotOpener(self)
        self.snapshots.failed.connect(self._on_snapshot_failed)
        #: Attach, detach and reconnect, and what the window shows of them.
        self.attaching = Attaching(self)
        #: The Open dialogs, the recent scripts and dropped files.
        self.opening = Opening(self)
        self.setAcceptDrops(True)
        #: Scope, x axis, unit, window, follow and pause: what every view shows.
        self.view = ViewState(self)
        #: The Tune and Lab panels, made the first time their docks show.
        self.panels = LazyPanels(self)
        self._build_views()
        build_actions(self)
        build_docks(self)
        build_toolbar(self)
        build_menus(self)
        build_status_bar(self, self.source.sampler.hz)
        self.rate_spin.valueChanged.connect(self._set_rate)
        #: Thread or separate process, and the allocator settings, of the next runs.
        self.run_mode = RunMode(self.settings, self.act_isolated, self.mode_label, self)
        self.run_mode.said.connect(self._on_run_mode_said)
        self.tune_dock.visibilityChanged.connect(self.panels.on_tune_visible)
        self.lab_dock.visibilityChanged.connect(self.panels.on_lab_visible)
        self._bind_view_state()
        self._connect_runs()
        # From here on every cyclic collection of this process runs in the GUI thread.
        self._collector = GuiThreadCollector.acquire()
        # Each view subscribes to the bridge itself; the window only keeps its own labels,
        # actions, banner and status bar in step.
        for view in (self.plot, self.readings, self.log, self.tensors, self.breakdown, self.alerts):
            view.bind(self.bridge)
        self.alerts.changed.connect(self._update_alert_badge)
        self.bridge.changed.connect(self._on_changed)
        self.bridge.events.connect(self.report.on_events)
        restore_window(self)
        self.update_actions()

    # -- construction ---------------------------------------------------------------------
    def _build_views(self) -> None:
        """The views of the Session; the chrome around them comes from window_chrome."""
        self.banner = Banner()
        self.plot = TracePlot(self.session)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 0)
        layout.addWidget(self.banner)
        layout.addWidget(self.plot, 1)
        self.setCentralWidget(central)
        self.log = LogPane()
        self.readings = ReadingsTable(self.session)
        self.readings.setMinimumWidth(300)
        self.readings.setMinimumHeight(150)
        self.tensors = TensorPanel(self.session)
        self.tensors.refresh_requested.connect(lambda: self.run_command("census"))
        self.tensors.auto_toggled.connect(self._set_auto_census)
        # What keeps a tensor alive is asked of the run's process in the command thread:
        # an agent may take seconds to answer, never while the window waits.
        self.tensors.ask_referrers = self.runs.ask_referrers
        self.runs.referrers_found.connect(self.tensors.referrers_found)
        self.alerts = AlertPanel(self.session)
        self.alerts.show_tensors.connect(self.show_culprits)
        self.alerts.mute_requested.connect(self.mute_alert)
        self.breakdown = BreakdownPlot(self.session)

    def _bind_view_state(self) -> None:
        """The views draw what the view state says; the actions show it."""
        for view in (self.plot, self.readings, self.tensors, self.breakdown):
            view.bind_view_state(self.view)
        state = self.view
        state.x_mode_changed.connect(lambda mode: self.act_steps.setChecked(mode == "steps"))
        state.follow_changed.connect(self.act_follow.setChecked)
        state.paused_changed.connect(self._on_paused)
        state.scope_changed.connect(self._show_scope)
        self.act_follow.setChecked(state.follow)

    def _connect_runs(self) -> None:
        r = self.runs
        r.errored.connect(self.report.on_worker_errored)
        r.stuck_detected.connect(self.report.on_stuck)
        r.ended.connect(self._on_run_ended)
        r.abandoned_ended.connect(self.report.on_abandoned_ended)
        r.rerun_due.connect(lambda: QTimer.singleShot(0, self.run))

    # -- what the run controller knows, as the window shows it ------------------------------
    @property
    def attached(self) -> AttachedRun | None:
        """The attached run, if any."""
        return self.runs.attached

    @property
    def stopping(self) -> bool:
        """True from a stop request until the run has ended."""
        return self.runs.stopping

    # -- settings -------------------------------------------------------------------------
    def set_theme(self, theme: str) -> None:
        """Switch between the system, light and dark palettes; remembered."""
        app = QApplication.instance()
        apply_theme(app, theme)
        self.settings.setValue("view/theme", theme)
        self.plot.setPalette(app.palette())
        self.plot.apply_palette()
        self.log.setPalette(app.palette())
        self.log.update_formats()
        self.breakdown.setPalette(app.palette())
        self.breakdown.apply_palette()
        self.panels.apply_palette()

    # -- running scripts ------------------------------------------------------------------
    @property
    def last_result(self) -> RunFinished | None:
        """How the last run shown ended (None while it runs, or before any)."""
        return self.report.last_result

    @property
    def running(self) -> bool:
        """True while a script thread or an attach is alive."""
        return self.runs.running

    @Slot(str)
    def _on_snapshot_failed(self, text: str) -> None:
        self.show_error(text, "warning")

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        """Accept files: a script runs, a recorded session reopens, anything else is read
        as a memory snapshot."""
        if event.mimeData().hasUrls() and all(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        """Open the dropped file by its kind (see :meth:`dragEnterEvent`)."""
        urls = event.mimeData().urls()
        if not urls:
            return
        path = urls[0].toLocalFile()
        event.acceptProposedAction()
        self.opening.open_dropped(path)

    def load_script(
        self,
        script: str,
        args: list[str] | None = None,
        run: bool = False,
        cwd: str | None = None,
    ) -> bool:
        """Make ``script`` the current script (checked first); optionally run it.

        While another run is in progress it asks first: stop (or detach from) that run and
        run this script once it has ended, or keep it and open nothing. The title always
        names what the traces show.
        """
        try:
            validate_script(script)
        except ScriptError as exc:
            self.show_error(str(exc))
            return False
        switching = self.running
        if switching:
            current = (
                self.attached.label if self.attached is not None else Path(self.script or "").name
            )
            what = "Detach from" if self.attached is not None else "Stop"
            if (
                QMessageBox.question(
                    self,
                    "A run is in progress",
                    f"{what} {current} and run {Path(script).name} once it has ended?",
                )
                != QMessageBox.Yes
            ):
                self.statusBar().showMessage(
                    f"Kept {current} running; {Path(script).name} was not opened", 10000
                )
                return False
        self.script = str(Path(script).resolve())
        if args is not None:
            self.script_args = list(args)
            self.args_edit.setText(shlex.join(self.script_args))
        if cwd is not None:
            self.cwd = cwd
        self.opening.remember(self.script)
        if switching:
            self.session.note(f"{Path(self.script).name} runs once the current run has ended")
            if self.attached is not None:
                self.detach()
            else:
                self.stop(confirm=False)
            self.runs.queue_rerun()
            self.update_actions()
            return True
        self.setWindowTitle(f"{Path(self.script).name} – torchmem")
        if not run and not self.running:
            self.run_label.setText(f"Ready: {Path(self.script).name} (F5 runs it)")
        self.update_actions()
        if run:
            return self.run()
        return True

    def show_error(self, text: str, severity: str = "error") -> None:
        """Show a message in the banner, the status bar and the log."""
        self.banner.show_message(text, severity)
        self.statusBar().showMessage(text.splitlines()[0], 15000)
        self.session.note(text)

    @Slot()
    def run(self) -> bool:
        """Run the current script in a background QThread (no-op while one runs)."""
        if self.running or not self.script:
            if self.attached is not None:
                self.show_error("Detach (Ctrl+Shift+D) before running a script.", "info")
                return False
            if not self.script:
                self.show_error("No script to run: open one (Ctrl+O) or the demo.", "info")
            return False
        try:
            self.script_args = shlex.split(self.args_edit.text())
        except ValueError as exc:
            self.show_error(f"Cannot parse the script arguments: {exc}. Check the quotes.")
            return False
        try:
            validate_script(self.script)
        except ScriptError as exc:
            self.show_error(str(exc))
            return False
        self.banner.hide()
        self.clear_views()
        self.setWindowTitle(f"{Path(self.script).name} – torchmem")
        self.runs.start_script(
            self.script,
            self.script_args,
            self.cwd,
            self.run_mode.separate,
            self.run_mode.env(),
        )
        self.update_actions()
        return True

    @Slot()
    def stop(self, *, confirm: bool = True) -> None:
        """Ask the running script to stop at its next step (forced after 2 s).

        An attached script was not started here: stopping it asks first.
        """
        if self.running:
            if self.attached is not None:
                if not self.attached.has_agent:
                    self.show_error(
                        "This process is watched from outside (no agent): torchmem cannot "
                        "stop it. Detach with Ctrl+Shift+D.",
                        "info",
                    )
                    return
                if confirm and (
                    QMessageBox.question(
                        self,
                        "Stop the attached script?",
                        f"Stop {self.attached.label} at its next step? It was not started "
                        "from this window.",
                    )
                    != QMessageBox.Yes
                ):
                    return
            self.runs.request_stop()
            self.run_label.setText("Stopping…")
            self.update_actions()

    @Slot()
    def rerun(self) -> None:
        """Stop the current run if any, then run again with the current arguments."""
        if self.running:
            if not self.stopping:
                self.stop()
            if self.stopping:  # a "No" to stopping an attached run re-runs nothing
                self.runs.queue_rerun()
                self.statusBar().showMessage("Re-run starts once the script has stopped", 10000)
        else:
            self.run()

    @Slot()
    def abandon_run(self) -> None:
        """Let go of an in-process run that does not stop (see :attr:`stuck`)."""
        self.runs.abandon()
        # The run has ended for this window: its recording too, with its summary (left
        # open, it read back as "killed or crashed", 0 steps, at the window's close).
        self.recordings.recorder.end_run()
        self.bridge.flush()
        self.update_actions()

    # -- attaching ------------------------------------------------------------------------
    def attach(
        self,
        pid: int | None,
        entries: list | None = None,
        inject: bool = False,
        hosts: list | None = None,
    ) -> bool:
        """Show process ``pid`` (and its ranks) here: see :meth:`Attaching.attach`."""
        return self.attaching.attach(pid, entries, inject, hosts)

    @Slot()
    def detach(self) -> None:
        """Stop following the attached process (it carries on)."""
        self.attaching.detach()

    def clear_views(self) -> None:
        """Empty every view and the Session for a new run, attach or recording."""
        self.recordings.opened = None
        self.session.reset()
        self.plot.clear_data()
        self.plot.scope = None
        # Garbage of the previous run's views is freed now, in the GUI thread, before the
        # script can call gc.collect() in its own (see gui_gc: PySide6 deadlocks destroying
        # a Qt object off the GUI thread).
        gc.collect()
        self.readings.clear_rows()
        self.tensors.clear()
        self.breakdown.refresh(force=True)
        self.alerts.refresh()
        self.log.start_section()
        self.report.last_result = None

    @Slot(str)
    def _on_run_ended(self, attached_label: str) -> None:
        self.recordings.recorder.end_run()
        if attached_label and self.session.run_finished is None:
            self.run_label.setText(f"Detached from {attached_label}")
        self.bridge.flush()
        self.update_actions()
        self.attaching.on_run_ended()

    @Slot(object)
    def _show_scope(self, scope: str | None) -> None:
        """The rank chooser shows the view state's scope (set here or by a new run)."""
        index = self.rank_combo.findData(scope) if scope is not None else 0
        if index >= 0 and index != self.rank_combo.currentIndex():
            self.rank_combo.blockSignals(True)
            self.rank_combo.setCurrentIndex(index)
            self.rank_combo.blockSignals(False)

    # -- session events -------------------------------------------------------------------
    def _update_rank_combo(self) -> None:
        scopes = self.session.scopes()
        known = [self.rank_combo.itemData(i) for i in range(1, self.rank_combo.count())]
        if scopes == known:
            return
        current = self.view.scope
        self.rank_combo.blockSignals(True)
        self.rank_combo.clear()
        self.rank_combo.addItem("Every rank", None)
        for scope in scopes:
            self.rank_combo.addItem(scope_label(scope).capitalize(), scope)
        self.rank_combo.blockSignals(False)
        self._rank_combo_action.setVisible(bool(scopes))
        # The chosen rank is gone (a new run): every rank again.
        self.view.set_scope(current if current in scopes else None)
        self._show_scope(self.view.scope)

    @Slot()
    def _on_changed(self) -> None:
        self._update_rank_combo()
        self.samples_label.setText(f"{self.session.samples:,} samples")
        self.report.show_progress()

    @property
    def allocator_conf(self) -> str:
        """PYTORCH_CUDA_ALLOC_CONF of the next runs ("" for the allocator's defaults)."""
        return self.run_mode.allocator_conf

    @Slot()
    def edit_allocator_settings(self) -> None:
        """Run > Allocator settings: PYTORCH_CUDA_ALLOC_CONF of the next runs, checked."""
        self.run_mode.edit_allocator(self)

    @Slot(str, bool)
    def _on_run_mode_said(self, text: str, refused: bool) -> None:
        if refused:
            self.show_error(text)
        else:
            self.statusBar().showMessage(text, 10000)

    # -- commands -------------------------------------------------------------------------
    def run_command(self, name: str) -> None:
        """Queue one of the target's commands (``probe.commands.COMMANDS``: gc.collect,
        empty_cache, reset peaks, a census, allocation history, a snapshot) for the
        command thread.

        Commands run one after another in that thread, in the order they were pressed;
        each result arrives through the Session like any other event.
        """
        if name == "census" and not self.running:
            # After the run its tensors are gone: a census now would replace the run's
            # last one with an empty one (and flatten the breakdown back to step 0).
            last = self.session.censuses()[0]
            self.statusBar().showMessage(
                "No script is running: "
                + (
                    f"the run's last census (step {last.step:,}) stays shown"
                    if last is not None
                    else "a census lists the tensors of a running script"
                ),
                10000,
            )
            return
        self.statusBar().showMessage(f"{COMMANDS[name].label}…")
        self.runs.run_command(name)

    # -- state ----------------------------------------------------------------------------
    def update_actions(self) -> None:
        """Enable and check the actions as the run, attach and recording stand now."""
        sync_actions(self)

    # -- alerts ---------------------------------------------------------------------------
    def _update_alert_badge(self) -> None:
        count = self.alerts.active_count
        self.alerts_dock.setWindowTitle(f"Alerts ({count})" if count else "Alerts")

    @Slot(str)
    def show_culprits(self, words: str) -> None:
        """Open the Tensors panel filtered to an alert's culprits (a new census while the
        script runs; the run's last one after it ended)."""
        self.tensors.filter_edit.setText(words)
        self.tensors_dock.raise_()
        if self.running:  # the culprits as they are now, not an old census's
            self.run_command("census")

    @Slot(str)
    def mute_alert(self, key: str) -> None:
        """Stop reporting one alert signature in this session."""
        self.session.mute(key)
        self.alerts.refresh()
        self.statusBar().showMessage(f"Muted {key}", 5000)

    def edit_leak_settings(self) -> None:
        """Edit the detector's thresholds; remembered in the settings."""
        dialog = LeakSettingsDialog(self.source.leak_settings, self.settings, self)
        if dialog.exec():
            self.source.configure_leaks(dialog.result_settings())

    @Slot(bool)
    def _set_auto_census(self, enabled: bool) -> None:
        self.source.set_auto_census(enabled)
        self.settings.setValue("census/auto", enabled)

    @Slot()
    def _toggle_isolated(self) -> None:
        self.run_mode.isolated_toggled()

    @Slot(int)
    def _set_rate(self, hz: int) -> None:
        self.runs.set_rate(hz)

    @Slot(bool)
    def _on_paused(self, paused: bool) -> None:
        self.act_pause.setChecked(paused)
        self.statusBar().showMessage(
            "Drawing paused (still recording)" if paused else "Drawing resumed", 3000
        )

    def show_shortcuts(self) -> None:
        """A dialog listing every shortcut."""
        QMessageBox.information(self, "Keyboard shortcuts", shortcuts_table(self))

    def show_about(self) -> None:
        """Version and a one-line description."""
        import torch

        QMessageBox.about(
            self,
            "About torchmem",
            f"<b>torchmem {__version__}</b><br>Live monitor for PyTorch memory.<br>"
            f"PyTorch {torch.__version__}, Python {sys.version.split()[0]}",
        )

    # -- closing --------------------------------------------------------------------------
    def shutdown(self, timeout_ms: int = 6000) -> bool:
        """Stop the script and every thread; True when all ended within ``timeout_ms``.

        A script already known to be blocked in a C call (or abandoned) is not waited for:
        the process exits at once (``force_exit_needed``).
        """
        panels = self.panels.shutdown(timeout_ms)
        snapshots = self.snapshots.shutdown(timeout_ms)
        clean = panels and snapshots and self.runs.shutdown(timeout_ms)
        self.recordings.close()
        self.bridge.close()
        if self._collector is not None:
            GuiThreadCollector.release()
            self._collector = None
        self.force_exit_needed = not clean
        return clean

    def closeEvent(self, event: QCloseEvent) -> None:
        """Save settings, stop the script cooperatively and wait for the threads."""
        save_window(self)
        if not self.shutdown():
            sys.stderr.write(
                "torchmem: the script did not stop (blocked in a C call?); exiting anyway.\n"
            )
        event.accept()
