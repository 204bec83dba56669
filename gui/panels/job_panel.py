"""What the panels of long jobs share (tuning, the memory lab): a worker QObject in a
QThread of its own, Cancel, a wait on close, and a status line that turns red on errors.

Each panel's worker is a :class:`Worker` (its :meth:`~Worker.work` is the job) and
the panel calls :meth:`JobPanel.start_job`; the thread's end comes back through the
worker's ``finished``, where the panel calls :meth:`JobPanel.job_ended`.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QThread, Slot
from PySide6.QtWidgets import QFileDialog, QLabel, QWidget

from torchmem.gui.workers import Worker, start_in_thread, wait_thread


class JobPanel(QWidget):
    """A panel that runs one job at a time off the GUI thread."""

    #: Said while a cancelled job winds down.
    CANCELLING = "Cancelling…"
    #: The Export… dialog: its title, the file it proposes, and its filters.
    EXPORT = ("Export", "export.csv", "CSV (*.csv)")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self._thread: QThread | None = None
        self._worker: Worker | None = None

    @property
    def running(self) -> bool:
        """True while a job runs."""
        return self._thread is not None

    def start_job(self, worker: QObject, name: str) -> None:
        """Run ``worker.run`` in a new thread named ``name``; its ``errored`` goes to the
        status line (a slot: queued to the GUI thread)."""
        worker.errored.connect(self._on_error)  # type: ignore[attr-defined]
        self._worker = worker
        self._thread = start_in_thread(
            worker,
            name,
            worker.run,
            worker.finished,  # type: ignore[attr-defined]
        )

    def job_ended(self) -> None:
        """Forget the job's thread once it ended (call from the ``finished`` slot)."""
        if self._thread is not None:
            wait_thread(self._thread, 5000)
        self._thread = self._worker = None

    @Slot()
    def cancel(self) -> None:
        """Stop the job now (whatever it runs in another process is ended first)."""
        if self._worker is not None:
            self._worker.cancel()
            self.say(self.CANCELLING)

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        """Cancel and wait for the job's thread (the window is closing)."""
        if self._thread is None:
            return True
        self.cancel()
        done = wait_thread(self._thread, timeout_ms)
        if done:
            self._thread = self._worker = None
        return done

    def say(self, text: str, error: bool = False) -> None:
        """Show ``text`` on the status line, in red for an error."""
        self.status.setStyleSheet("color: #c0392b;" if error else "")
        self.status.setText(text)

    @Slot(str)
    def _on_error(self, text: str) -> None:
        self.say(text, error=True)

    @Slot()
    def _export_dialog(self) -> None:
        title, proposed, filters = self.EXPORT
        path, _ = QFileDialog.getSaveFileName(self, title, proposed, filters)
        if path:
            self.export(path)

    def export(self, path: str) -> object:
        """Write the job's result to ``path`` (each panel says in which formats)."""
        raise NotImplementedError
