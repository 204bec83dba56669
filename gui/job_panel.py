"""What the panels of long jobs share (tuning, the memory lab): a worker QObject in a
QThread of its own, Cancel, a wait on close, and a status line that turns red on errors.

Each panel's worker is a :class:`JobWorker` (its :meth:`~JobWorker.work` is the job) and
the panel calls :meth:`JobPanel.start_job`; the thread's end comes back through the
worker's ``finished``, where the panel calls :meth:`JobPanel.job_ended`.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot
from PySide6.QtWidgets import QFileDialog, QLabel, QWidget

from .workers import start_in_thread, wait_thread


class JobWorker(QObject):
    """Runs :meth:`work` in its thread; always ends with ``finished``, and says through
    ``errored`` why it gave nothing: cancelled, a known error's message, or its own bug."""

    #: Why the job gave no result (said in the panel's status line, in red).
    errored = Signal(str)
    #: Always last: what :meth:`work` returned (None after an error or a cancel).
    finished = Signal(object)
    #: The exception that means "cancelled", what to say then, the errors whose message
    #: is for the user as it is, and what to put before an unexpected one.
    cancelled: type[BaseException] = Exception
    cancelled_text = "cancelled"
    known: tuple[type[BaseException], ...] = ()
    failed_text = "the job failed"

    def __init__(self) -> None:
        super().__init__()
        self.cancel_event = threading.Event()

    def work(self) -> Any:
        """The job itself, in the worker's thread."""
        raise NotImplementedError

    @Slot()
    def run(self) -> None:
        """Run :meth:`work`; always ends with ``finished``."""
        result = None
        try:
            result = self.work()
        except self.cancelled:
            self.errored.emit(self.cancelled_text)
        except self.known as exc:
            self.errored.emit(str(exc))
        except Exception as exc:  # torchmem's own failure: said, never a dead thread
            self.errored.emit(f"{self.failed_text}: {type(exc).__name__}: {exc}")
        finally:
            self.finished.emit(result)

    def cancel(self) -> None:
        """Stop now, ending whatever runs in another process first (any thread)."""
        self.cancel_event.set()


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
        self._worker: JobWorker | None = None

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
