"""Worker objects that run off the GUI thread: one base for one-shot work (the script,
an attach, a search, a measurement, a snapshot's reading), and the user's commands.

Each is a QObject moved to a QThread (the superqt/napari pattern): the thread's
``started`` signal calls the worker's slot, the worker's ``finished`` quits the thread,
and the window waits for the thread before it closes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal, SignalInstance, Slot

from torchmem.events import RunFinished
from torchmem.sources.attached import AttachedRun
from torchmem.sources.base import Script, ScriptSource, Source
from torchmem.transport.client import AttachError


class Worker(QObject):
    """The one base of the window's one-shot workers: :meth:`work` runs in the worker's
    QThread; it always ends with ``finished`` (what ``work`` returned, or None), and says
    why it gave nothing (as superqt's WorkerBase does): a cancel, an expected error
    (:attr:`known`, whose message is for the user as it is) or a bug of torchmem's.

    Subclasses set what they expect and may send the errors to signals of their own
    (:meth:`report_known`, :meth:`report_bug`); the worker's thread is never left dead.
    """

    #: Why the work gave nothing (a status line or a banner says it).
    errored = Signal(str)
    #: Always last: what :meth:`work` returned (None after an error or a cancel).
    finished = Signal(object)
    #: The exceptions that mean "cancelled", and what to say then ("": nothing).
    cancelled: tuple[type[BaseException], ...] = ()
    cancelled_text = ""
    #: Errors whose message is for the user as it is.
    known: tuple[type[BaseException], ...] = ()
    #: What goes before an unexpected error's type and message ("": nothing).
    failed_text = ""

    def __init__(self) -> None:
        super().__init__()
        self.cancel_event = threading.Event()

    def work(self) -> Any:
        """The job itself, in the worker's thread."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Stop now, ending whatever runs in another process first (any thread)."""
        self.cancel_event.set()

    def report_known(self, exc: BaseException) -> None:
        """An expected error: its message, as it is."""
        self.errored.emit(str(exc))

    def report_bug(self, text: str) -> None:
        """An error of torchmem's own (said, so that nothing waits on "running")."""
        self.errored.emit(text)

    @Slot()
    def run(self) -> None:
        """Run :meth:`work`; always ends with ``finished``."""
        result = None
        try:
            result = self.work()
        except self.cancelled:
            if self.cancelled_text:
                self.errored.emit(self.cancelled_text)
        except self.known as exc:
            self.report_known(exc)
        except Exception as exc:  # torchmem's own failure: said, never a dead thread
            what = f"{type(exc).__name__}: {exc}"
            self.report_bug(f"{self.failed_text}: {what}" if self.failed_text else what)
        finally:
            self.finished.emit(result)


class ScriptWorker(Worker):
    """Runs one script through a source (in this process or a child), in its own QThread.

    ``finished`` carries the RunFinished; ``errored`` says what went wrong in torchmem
    itself (never the script's errors, which are the run's result).
    """

    def __init__(
        self,
        source: ScriptSource,
        script: str,
        args: list[str],
        cwd: str | None,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.script = script
        self.args = args
        self.cwd = cwd
        self.env = tuple((env or {}).items())

    def work(self) -> RunFinished:
        """Run the script to its end (the runner never raises for the script's errors)."""
        script = Script(self.script, tuple(self.args), self.cwd, env=self.env)
        return self.source.run_script(script)


class AttachWorker(Worker):
    """Attaches to a running process and follows it until it ends or the user detaches."""

    attached = Signal(str)  # what is attached, for the status line
    failed = Signal(str)  # why attaching failed (says what to do)
    known = (AttachError,)

    def __init__(self, run: AttachedRun) -> None:
        super().__init__()
        self.run_ = run

    def work(self) -> None:
        """Connect, then block (in this thread) until the attached processes end."""
        self.run_.connect()
        self.attached.emit(self.run_.label)
        self.run_.follow()

    def report_known(self, exc: BaseException) -> None:
        """Attaching failed: said as a failure to attach, with what to do."""
        self.failed.emit(str(exc))

    def report_bug(self, text: str) -> None:
        """An error while following (a process that vanished oddly): stop following."""
        self.errored.emit(text)
        self.run_.close()


class CommandWorker(QObject):
    """Runs the target's commands (``probe.commands.COMMANDS``: gc.collect, empty_cache,
    reset peaks, a census, allocation history, a snapshot, ...) and its referrer lookups
    off the GUI thread, one at a time."""

    #: A referrers answer: (request id, the answer dict, or why none came, as text).
    referrers_found = Signal(int, object)

    def __init__(self, target: Callable[[], Source]) -> None:
        super().__init__()
        self.target = target  # the source commands go to now (local, isolated or attached)

    @Slot(str)
    def run(self, name: str) -> None:
        """Run one command; its result lands in the Session."""
        self.target().command(name)

    @Slot(int, object, str)
    def find_referrers(self, request: int, tensor: object, scope: str) -> None:
        """Ask the process that owns ``tensor`` (of ``scope`` in a job) what keeps it
        alive (an agent may take seconds to answer, or never: here, never in the GUI
        thread)."""
        try:
            answer: object = self.target().referrers(tensor, scope)
        except Exception as exc:  # a lost connection, a process that ended
            answer = f"cannot ask the process ({exc})"
        self.referrers_found.emit(request, answer)


def start_in_thread(
    worker: QObject, name: str, entry: object = None, done: SignalInstance | None = None
) -> QThread:
    """Move ``worker`` to a new QThread, call ``entry`` when it starts, and start it.

    When ``done`` fires, the thread's event loop quits from the worker's own thread (a
    direct connection), so the thread ends even while the GUI thread is busy waiting.
    """
    thread = QThread()
    thread.setObjectName(name)
    worker.moveToThread(thread)
    if entry is not None:
        thread.started.connect(entry)
    if done is not None:
        done.connect(thread.quit, Qt.DirectConnection)
    thread.start()
    return thread


def wait_thread(thread: QThread, timeout_ms: int) -> bool:
    """Wait for ``thread`` to finish without starving it of the GIL.

    ``QThread.wait`` keeps the GIL while it blocks, so a long wait would stop the very
    Python code it waits for. Short waits with GIL-free sleeps in between let it run.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    while not thread.wait(5):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
