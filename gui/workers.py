"""Worker objects that run off the GUI thread: the script, and user commands.

Each is a QObject moved to a QThread (the superqt/napari pattern): the thread's
``started`` signal calls the worker's slot, the worker's ``finished`` quits the thread,
and the window waits for the thread before it closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, QThread, Signal, SignalInstance, Slot

from torchmem.sources.attached import AttachedRun
from torchmem.sources.base import Script, ScriptSource, Source
from torchmem.transport.client import AttachError


class ScriptWorker(QObject):
    """Runs one script through a source (in this process or a child), in its own QThread.

    Like every worker here it always ends with ``finished``, and reports what went wrong
    in torchmem itself (never the script's errors, which are the run's result) through
    ``errored`` (superqt's WorkerBase has the same shape).
    """

    finished = Signal(object)  # RunFinished, or None after an error of torchmem's
    errored = Signal(str)

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

    @Slot()
    def run(self) -> None:
        """Run the script to its end (the runner never raises for the script's errors)."""
        result = None
        try:
            script = Script(self.script, tuple(self.args), self.cwd, env=self.env)
            result = self.source.run_script(script)
        except Exception as exc:  # a bug of torchmem's: say it, never hang on "running"
            self.errored.emit(f"{type(exc).__name__}: {exc}")
        finally:
            self.finished.emit(result)


class AttachWorker(QObject):
    """Attaches to a running process and follows it until it ends or the user detaches."""

    attached = Signal(str)  # what is attached, for the status line
    failed = Signal(str)  # why attaching failed (says what to do)
    errored = Signal(str)  # an error while following (a process that vanished oddly)
    finished = Signal(object)  # always last

    def __init__(self, run: AttachedRun) -> None:
        super().__init__()
        self.run_ = run

    @Slot()
    def run(self) -> None:
        """Connect, then block (in this thread) until the attached processes end."""
        try:
            self.run_.connect()
            self.attached.emit(self.run_.label)
            self.run_.follow()
        except AttachError as exc:
            self.failed.emit(str(exc))
        except Exception as exc:
            self.errored.emit(f"{type(exc).__name__}: {exc}")
            self.run_.close()
        finally:
            self.finished.emit(None)


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

    @Slot(int, object)
    def find_referrers(self, request: int, tensor: object) -> None:
        """Ask the process that owns ``tensor`` what keeps it alive (an agent may take
        seconds to answer, or never: here, never in the GUI thread)."""
        try:
            answer: object = self.target().referrers(tensor)
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
