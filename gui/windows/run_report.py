"""What the window says of a run as its events arrive, beside what the views draw.

The run label and the status bar follow the run's start and end, a new alert's headline
and each command's result; a run that failed, ran out of memory or was killed gets a
banner, and an out-of-memory end opens the Out of memory dialog (kept, one at a time).
The views render the same events themselves; this is the window's own account.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QTimer, Slot

from torchmem.events import Alert, CommandResult, RunFinished, RunStarted, RunStatus
from torchmem.gui.dialogs.oom_dialog import OomDialog
from torchmem.leaks.oom import explain_oom

if TYPE_CHECKING:
    from torchmem.gui.windows.main_window import MainWindow


class RunReport(QObject):
    """The window's run label, status bar, banner and OOM dialog, kept in step with the
    Session's events."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        #: How the last run shown ended (None while it runs, or before any).
        self.last_result: RunFinished | None = None
        #: The Out of memory dialog while it is open.
        self.oom_dialog: OomDialog | None = None

    @Slot(list)
    def on_events(self, events: list) -> None:
        w = self.window
        # What the window itself shows of a run's events (the views render their own).
        for event in events:
            if isinstance(event, RunStarted):
                w.run_label.setText("● Running")
                w.act_history.setChecked(False)  # a new process records nothing yet
                if w.attached is None:  # accelerators are found as a run starts
                    w.update_actions()
            elif isinstance(event, RunFinished):
                self.show_finished(event)
            elif isinstance(event, Alert) and event.is_new:
                w.statusBar().showMessage(event.headline, 30000)
            elif isinstance(event, CommandResult):
                self.on_command_result(event)

    @Slot()
    def show_oom_report(self) -> OomDialog | None:
        """The Out of memory dialog of the run shown, if it ended out of memory."""
        w = self.window
        report = explain_oom(w.session)
        if report is None:
            return None
        if self.oom_dialog is not None:
            self.oom_dialog.close()
        dialog = OomDialog(report, w)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.action_requested.connect(self._on_oom_action)
        dialog.destroyed.connect(lambda: setattr(self, "oom_dialog", None))
        self.oom_dialog = dialog
        dialog.show()
        w.update_actions()
        return dialog

    @Slot(str)
    def _on_oom_action(self, key: str) -> None:
        w = self.window
        if key == "tune":
            w.panels.open_tune()
        elif key == "leak":
            w.alerts_dock.show()
            w.alerts_dock.raise_()

    def on_command_result(self, event: CommandResult) -> None:
        """Say what a command did; a snapshot's file stays named in the banner."""
        w = self.window
        w.statusBar().showMessage(event.said, 15000)
        if event.command == "history_start":
            w.act_history.setChecked(event.ok)
        elif event.command == "history_stop" and event.ok:
            w.act_history.setChecked(False)
        elif event.command == "snapshot":  # a file to find again: say where, and keep it up
            w.banner.show_message(event.said, "info" if event.ok else "warning")

    def toggle_history(self, checked: bool) -> None:
        """Memory > Record allocation history: asked of the target, shown once it says."""
        w = self.window
        # The action shows the target's state once the result arrives, not the click.
        w.act_history.setChecked(not checked)
        w.run_command("history_start" if checked else "history_stop")

    def show_finished(self, event: RunFinished) -> None:
        """How the run ended, in the run label, the status bar and, for a failure, the
        banner; an out-of-memory end opens its dialog."""
        w = self.window
        self.last_result = event
        text = event.headline(w.session.steps.steps)
        w.run_label.setText(text)
        w.run_label.setToolTip(f"{text}: {event.message}")
        # The label on the right says how it ended; the message says why (never twice).
        w.statusBar().showMessage(event.message, 30000)
        if event.status is RunStatus.OOM:
            QTimer.singleShot(0, self.show_oom_report)  # after the views drew the run's end
        if event.status in (RunStatus.FAILED, RunStatus.OOM, RunStatus.KILLED):
            started = w.session.run_started
            name = Path(started.script).name if started else Path(w.script or "").name
            w.banner.show_message(f"{name}: {event.message}", "error")
        elif event.status is RunStatus.STOPPED:
            message = event.message[:1].upper() + event.message[1:]
            w.banner.show_message(f"{message}.", "info")

    def show_progress(self) -> None:
        """While a run goes on: its step and time, or how long a stop has been waited for."""
        w = self.window
        if not w.running or w.session.run_finished is not None:
            return
        if w.stopping:
            stuck = " (blocked in a C call?)" if w.runs.stuck else ""
            w.run_label.setText(f"Stopping… {w.runs.stop_waited_s:.0f} s{stuck}")
            return
        what = f"Attached to {w.attached.label}" if w.attached else "Running"
        what += w.attaching.nodes_text()
        steps = w.session.steps.steps
        w.run_label.setText(f"● {what} · step {steps:,} · {w.session.now():.1f} s")

    @Slot()
    def on_stuck(self) -> None:
        """A stop that did not end the run: why, and (in-process) an Abandon button."""
        w = self.window
        name = Path(w.script or "the script").name
        if w.runs.target is w.source:
            w.banner.show_message(
                f"{name} does not stop: it is blocked in a C call (a long time.sleep, input(), "
                "I/O or a C extension), where Python cannot interrupt it. It stops when that "
                "call returns. Abandon the run to free the window now; Run > Run in a "
                "separate process runs scripts that can always be stopped.",
                "warning",
                (
                    "Abandon the run",
                    w.abandon_run,
                    "The script's thread ends when its call returns; the next run goes "
                    "to a separate process",
                ),
            )
        elif w.attached is not None:
            w.banner.show_message(
                f"{w.attached.label} has not stopped yet: it stops at its next step, "
                "backward, mark or module call. Detach (Ctrl+Shift+D) to leave it running.",
                "info",
            )
        w.update_actions()

    @Slot()
    def on_abandoned_ended(self) -> None:
        """An abandoned script's thread ended at last."""
        w = self.window
        w.statusBar().showMessage("The abandoned script has ended at last", 10000)
        w.update_actions()

    @Slot(str)
    def on_worker_errored(self, message: str) -> None:
        """torchmem itself failed while following the run: said, the traces kept."""
        w = self.window
        w.run_label.setText("Stopped following: an error of torchmem's")
        w.show_error(
            f"torchmem stopped following this run after an error of its own ({message}). "
            "The traces so far are kept; please report it with the Log's text."
        )
