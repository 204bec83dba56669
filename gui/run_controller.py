"""The window's run lifecycle without widgets: what runs, in which thread, how it ends.

:class:`RunController` owns the sources (this process's and the isolated one), the
attached run, the worker threads, the command thread, and the stop / stuck / abandon /
re-run state. The window asks it to run, attach, stop, detach, abandon or run a command,
and redraws when it signals; confirmations and messages stay the window's. Tests drive it
without a window.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, Qt, QThread, QTimer, Signal, Slot

from torchmem.events import RunFinished, RunStatus
from torchmem.gui.workers import (
    AttachWorker,
    CommandWorker,
    ScriptWorker,
    start_in_thread,
    wait_thread,
)
from torchmem.probe.runner import EXIT_STOPPED
from torchmem.sources.attached import AttachedRun
from torchmem.sources.base import Source
from torchmem.sources.inprocess import InProcessSource
from torchmem.sources.isolated import IsolatedSource

#: After a stop request, how long before a run that goes on counts as stuck (blocked in a
#: C call, where Python cannot interrupt it).
STUCK_AFTER_MS = 5000


class RunController(QObject):
    """One run at a time (a script here, in a child, or an attach), and how it ends."""

    #: Attached to the process named by the label.
    attached_to = Signal(str)
    #: Attaching failed; the message says why and what to do.
    attach_failed = Signal(str)
    #: torchmem itself failed while running or following (never the script's errors).
    errored = Signal(str)
    #: A stop was asked for :attr:`stuck_after_ms` ago and the run goes on.
    stuck_detected = Signal()
    #: The run's thread has ended; carries the attached run's label if it was one.
    ended = Signal(str)
    #: An abandoned run's thread has ended at last.
    abandoned_ended = Signal()
    #: Run the script again now (a re-run queued while the previous run stopped).
    rerun_due = Signal()
    #: Attach again to this pid with an injected agent (after the outside watch ended).
    inject_due = Signal(int)
    #: Ask the command thread to run a command by name.
    command_requested = Signal(str)
    #: Ask the command thread what keeps a tensor alive: (request id, TensorInfo).
    referrers_requested = Signal(int, object, str)
    #: What keeps a tensor alive: (request id, the answer dict, or why none came).
    referrers_found = Signal(int, object)

    def __init__(self, source: InProcessSource, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.source = source
        self.session = source.session
        self.isolated = IsolatedSource(self.session, source.sampler.hz)
        #: Where commands, stop and the rate go now: the in-process source, the isolated
        #: one while it runs a script, or the attached processes.
        self.target: Source = source
        self.attached: AttachedRun | None = None
        self.stuck_after_ms = STUCK_AFTER_MS
        self._thread: QThread | None = None
        self._worker: ScriptWorker | AttachWorker | None = None
        #: When Stop was asked for in this run (None: not stopping).
        self._stop_requested_at: float | None = None
        self._rerun_pending = False
        self._inject_pid: int | None = None
        #: The SSH hosts the last attached run lost (for the window's Reconnect).
        self.lost_hosts: list[str] = []
        #: An in-process run let go of while blocked in a C call: (thread, worker) kept
        #: alive until the call returns (a running QThread must never be destroyed).
        self._abandoned: tuple[QThread, ScriptWorker] | None = None
        self._stuck_timer = QTimer(self)
        self._stuck_timer.setSingleShot(True)
        self._stuck_timer.setTimerType(Qt.PreciseTimer)  # a coarse one may fire 5 % early
        self._stuck_timer.timeout.connect(self._check_stuck)
        self._command_worker = CommandWorker(lambda: self.target)
        self._command_thread = start_in_thread(self._command_worker, "torchmem-commands")
        self.command_requested.connect(self._command_worker.run)
        self.referrers_requested.connect(self._command_worker.find_referrers)
        self._command_worker.referrers_found.connect(self.referrers_found)
        self._referrer_requests = 0

    # -- state ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """True while a script thread or an attach is alive."""
        return self._thread is not None

    @property
    def stopping(self) -> bool:
        """True from a stop request until the run has ended."""
        return self._stop_requested_at is not None

    @property
    def stuck(self) -> bool:
        """True when a stop was asked for long ago and the run still goes on (blocked in a
        C call: ``time.sleep``, ``input()``, I/O, a C extension)."""
        return (
            self.running
            and self._stop_requested_at is not None
            and time.monotonic() - self._stop_requested_at >= self.stuck_after_ms / 1000
        )

    @property
    def stop_waited_s(self) -> float:
        """Seconds since Stop was asked for (0 when not stopping)."""
        at = self._stop_requested_at
        return time.monotonic() - at if at is not None else 0.0

    @property
    def abandoned_alive(self) -> bool:
        """True while an abandoned run's thread still lives."""
        return self._abandoned is not None

    @property
    def can_abandon(self) -> bool:
        """True for a stuck run of this process (the only kind that needs abandoning)."""
        return self.stuck and self.target is self.source

    # -- runs -----------------------------------------------------------------------------
    def start_script(
        self,
        script: str,
        args: list[str],
        cwd: str | None,
        isolated: bool,
        env: dict[str, str] | None = None,
    ) -> None:
        """Run ``script`` in a QThread: here, or in a child when ``isolated`` (or while an
        abandoned run still occupies this process, or ``env`` sets allocator settings,
        which only a fresh process honours)."""
        if env and not isolated:
            isolated = True
        if self.source.abandoned and not isolated:
            self.session.note(
                "this process still runs the abandoned script (blocked in a C call): "
                "this run goes to a separate process"
            )
            isolated = True
        self.target = self.isolated if isolated else self.source
        worker = ScriptWorker(self.target, script, args, cwd, env)
        worker.errored.connect(self.errored)
        self._start(worker, "torchmem-script")

    def start_attach(
        self,
        pid: int | None,
        hz: float,
        entries: list | None = None,
        inject: bool = False,
        hosts: list | None = None,
    ) -> AttachedRun:
        """Attach to ``pid`` (and its ranks; on SSH ``hosts``) and follow it in a QThread
        (SSH connections are made there too: a slow host never freezes the window)."""
        run = AttachedRun(self.session, pid, hz, entries, inject, hosts)
        self.attached = run
        self.target = run
        worker = AttachWorker(run)
        worker.attached.connect(self.attached_to)
        worker.failed.connect(self.attach_failed)
        worker.errored.connect(self.errored)
        self._start(worker, "torchmem-attach")
        return run

    def _start(self, worker: ScriptWorker | AttachWorker, name: str) -> None:
        self._worker = worker
        worker.finished.connect(self._on_finished)
        self._thread = start_in_thread(worker, name, worker.run, worker.finished)

    def request_stop(self) -> None:
        """Ask the run to stop at its next step (the window has asked the user first)."""
        if not self.running:
            return
        self.target.request_stop()
        self._stop_requested_at = time.monotonic()
        self._stuck_timer.start(self.stuck_after_ms)

    def queue_rerun(self) -> None:
        """Run again once the current run has ended (:attr:`rerun_due`)."""
        self._rerun_pending = True

    def detach(self) -> None:
        """Stop following the attached process (it carries on)."""
        if self.attached is not None:
            self.attached.detach()

    def inject(self) -> None:
        """Replace the outside watch of the attached process by an injected agent."""
        run = self.attached
        if run is None or run.has_agent:
            return
        self._inject_pid = run.pid
        run.detach()  # attach again with injection once this watch has ended

    @Slot()
    def abandon(self) -> None:
        """Let go of a stuck run of this process: its thread lives on until its C call
        returns, its events are dropped, and the Session hears that the run ended."""
        worker, thread = self._worker, self._thread
        if not isinstance(worker, ScriptWorker) or thread is None or not self.can_abandon:
            return
        s = self.session
        steps = s.steps.steps
        started = s.run_started.t if s.run_started else 0.0
        self.source.abandon()
        worker.finished.disconnect(self._on_finished)
        worker.finished.connect(self._on_abandoned_finished)
        self._abandoned = (thread, worker)
        self._thread = self._worker = None
        self._stop_requested_at = None
        self._rerun_pending = False
        self._stuck_timer.stop()
        s.submit(
            RunFinished(
                s.now(),
                RunStatus.STOPPED,
                EXIT_STOPPED,
                f"abandoned at step {steps:,}: blocked in a C call, its thread ends when the "
                "call returns; the next run goes to a separate process",
                duration_s=s.now() - started,
            )
        )

    # -- commands and rate ----------------------------------------------------------------
    def run_command(self, name: str) -> None:
        """gc.collect, empty_cache, reset peaks, census, ... for the current target.

        Commands run one after another in the command thread, in the order they were
        asked for; each result arrives through the Session like any other event.
        """
        if name == "gc_collect" and self.target is self.source:
            # A collection in this process must run in the GUI thread (see gui_gc); it
            # holds the GIL throughout, so the window would wait for it anyway.
            self.source.command(name)
            return
        self.command_requested.emit(name)

    def ask_referrers(self, tensor: object, scope: str = "") -> int:
        """Ask the current target what keeps ``tensor`` (of the process ``scope`` of a
        job) alive, in the command thread; the answer comes by :attr:`referrers_found`
        with the request id returned here."""
        self._referrer_requests += 1
        self.referrers_requested.emit(self._referrer_requests, tensor, scope)
        return self._referrer_requests

    def set_rate(self, hz: float) -> None:
        """The sampling rate of this process, the isolated child and the attached run."""
        self.source.set_rate(hz)
        self.isolated.set_rate(hz)
        if self.attached is not None:
            self.attached.set_rate(hz)

    # -- endings --------------------------------------------------------------------------
    @Slot()
    def _check_stuck(self) -> None:
        if self.stuck:
            self.stuck_detected.emit()
        elif self.running and self.stopping:  # woken a little early: wait for the rest
            left = self.stuck_after_ms - 1000 * self.stop_waited_s
            self._stuck_timer.start(max(1, int(left) + 1))

    @Slot(object)
    def _on_finished(self, _result: RunFinished | None) -> None:
        if self._thread is not None:
            wait_thread(self._thread, 5000)  # it quits by itself once the worker is done
        self._thread = self._worker = None
        label = ""
        self.lost_hosts = []
        if self.attached is not None:
            label = self.attached.label
            self.lost_hosts = self.attached.lost_hosts()
            self.attached = None
        self.target = self.source
        self._stuck_timer.stop()
        self._stop_requested_at = None
        self.ended.emit(label)
        if self._inject_pid is not None:
            pid, self._inject_pid = self._inject_pid, None
            self.inject_due.emit(pid)
        if self._rerun_pending:
            self._rerun_pending = False
            self.rerun_due.emit()

    @Slot(object)
    def _on_abandoned_finished(self, _result: object) -> None:
        if self._abandoned is not None:
            wait_thread(self._abandoned[0], 5000)
            self._abandoned = None
        self.abandoned_ended.emit()

    def shutdown(self, timeout_ms: int = 6000) -> bool:
        """Stop the run (detach from an attached one) and every thread; True when all
        ended within ``timeout_ms``. A stuck or abandoned run is not waited for."""
        clean = self._abandoned is None
        if self.stuck:
            timeout_ms = 0
        if self._thread is not None:
            if self.attached is not None:
                self.attached.detach()  # never stop a process we only watch
            else:
                self.target.request_stop()
            ended = wait_thread(self._thread, timeout_ms)
            clean = clean and ended
            if ended:
                self._thread = None
        self._command_thread.quit()
        wait_thread(self._command_thread, 5000)
        self.source.close()
        self.isolated.close()
        return clean
