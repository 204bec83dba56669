"""The in-process source: a script run in this process, its sampler and its commands.

Everything it learns goes to one :class:`~torchmem.session.Session` as events. The GUI
drives it from worker threads; the headless ``torchmem run`` drives it from the main
thread; an agent serves it to viewers in other processes.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from torchmem.events import (
    CapacityKnown,
    CensusTaken,
    CommandResult,
    Event,
    Marker,
    MarkerKind,
    RunFinished,
    Sample,
)
from torchmem.leaks.detector import LeakDetector, LeakSettings
from torchmem.probe.backends import (
    MemoryBackend,
    ProcessBackend,
    accelerator_backends,
    backends_capacity,
    discover_backends,
    reset_peak_rss,
)
from torchmem.probe.commands import (
    allocation_history,
    empty_cache,
    gc_collect,
    reset_peaks,
    save_snapshot,
    snapshot_dir,
)
from torchmem.probe.heap import trim_heap
from torchmem.probe.runner import ScriptRunner
from torchmem.probe.sampler import Sampler
from torchmem.probe.step_pace import StepPace
from torchmem.probe.steps import StepTracker
from torchmem.session import Session, error_line
from torchmem.sources.base import Script
from torchmem.tensors.model import TensorInfo, describe_census
from torchmem.tensors.namespaces import script_namespaces, traceback_namespaces
from torchmem.tensors.referrers import referrers_of
from torchmem.tensors.schedule import CensusSchedule
from torchmem.tensors.walk import take_census


class CensusFailed(RuntimeError):
    """A census asked of the script's thread failed there (the message says why)."""


class WatchedThread:
    """Code that already runs in this process (``torchmem.serve()``): its steps, its stop.

    The counterpart of :class:`~torchmem.probe.runner.ScriptRunner` for a script torchmem did
    not start: the same step hooks, installed for the thread that asked to be served.
    """

    def __init__(self, tracker: StepTracker, thread_ident: int, script: str | None) -> None:
        self.tracker = tracker
        self.thread_ident: int | None = thread_ident
        self.script = script

    @property
    def steps(self) -> int:
        """Steps seen so far."""
        return self.tracker.steps

    def request_stop(self) -> None:
        """Stop at the thread's next step, backward, mark or module forward (no forcing:
        torchmem does not own this thread's exit)."""
        self.tracker.request_stop()


_active: InProcessSource | None = None


def active_source() -> InProcessSource | None:
    """The source running a script in this process right now (``torchmem run``, the
    window), so that ``torchmem.serve()`` in that script serves that run."""
    return _active


class InProcessSource:
    """Runs scripts in this process and samples this process's memory."""

    def __init__(
        self,
        session: Session,
        backends: Sequence[MemoryBackend] | None = None,
        hz: float = 10.0,
        lazy: bool = False,
    ) -> None:
        """``backends`` default to every one this machine has; with ``lazy`` (the window)
        only host memory until the first run starts: finding accelerators imports torch,
        which takes longer than the whole window to appear and holds 200 MiB that a window
        used to attach, or to run scripts in their own process, never needs."""
        self.session = session
        self._lazy = backends is None and lazy
        if backends is not None:
            self.backends = list(backends)
        else:
            self.backends = [ProcessBackend()] if lazy else discover_backends()
        self.sampler = Sampler(self.backends, session.submit, hz, clock=session.now)
        self._runner: ScriptRunner | WatchedThread | None = None
        self.steps_seen = 0
        self.pace = StepPace()  # one step-time measurement for every per-step budget
        self.census_schedule = CensusSchedule(pace=self.pace)
        self.leaks = LeakDetector(session.submit, self.capacity(), LeakSettings())
        session.subscribe(self._feed_leaks)
        #: Series keys seen in this run's readings, and the capacity last reported.
        self._keys_seen: set[str] = set()
        self._capacity_sent: dict[str, int] = {}
        self._boundary = BoundaryClock(self.pace)
        self._census_wanted = threading.Event()
        self._census_done = threading.Event()
        self._census_reply: CensusTaken | None = None
        self._census_error = ""
        self._census_failed = False  # automatic censuses are off for the run after a failure
        self._abandoned = False
        self._history_on = False  # CUDA allocation history, as the user last set it
        #: The measured commands of probe.commands.COMMANDS, by name.
        self._handlers: dict[str, Callable[[Callable[[], float]], CommandResult]] = {
            "gc_collect": lambda now: gc_collect(self.backends, now),
            "empty_cache": lambda now: empty_cache(self.backends, now),
            "reset_peaks": self._reset_peaks,
            "census": self._census_command,
            "history_start": lambda now: self._history(now, record=True),
            "history_stop": lambda now: self._history(now, record=False),
            "snapshot": lambda now: save_snapshot(
                self.backends, now, snapshot_dir(), self._snapshot_names
            ),
        }

    @property
    def has_accelerator(self) -> bool:
        """True when an accelerator backend is present (enables empty_cache)."""
        return any(b.is_accelerator for b in self.backends)

    def capacity(self) -> dict[str, int]:
        """Total memory per device, where known."""
        return backends_capacity(self.backends)

    def find_accelerators(self) -> None:
        """Add the accelerator backends a lazy source left out (once; imports torch). The
        sampler takes the new list at its next tick."""
        if not self._lazy:
            return
        self._lazy = False
        found = accelerator_backends()
        if found:
            self.backends = [*self.backends, *found]
            self.sampler.backends = list(self.backends)

    def _report_capacity(self) -> None:
        """Submit the devices' total memory when it says more than last time: at a run's
        start, and when its readings name a device first (CUDA is counted once the script
        has initialised it, after the run began)."""
        capacity = self.capacity()
        if capacity != self._capacity_sent:
            self._capacity_sent = capacity
            self.emit(CapacityKnown(self.session.now(), capacity))

    def _new_run(self) -> None:
        """What every run (a script here, or a watched thread) starts from."""
        self.census_schedule.reset()
        self._census_failed = False
        self._keys_seen, self._capacity_sent = set(), {}

    # -- runs ---------------------------------------------------------------------------
    def run_script(self, script: Script) -> RunFinished:
        """Run ``script`` in the calling thread, sampling while it runs; blocks until it ends."""
        global _active
        runner = ScriptRunner(
            script.path,
            list(script.args),
            self.emit,
            self.session.now,
            script.cwd,
            script.capture_output,
            on_oom=self._on_oom,
            echo=script.echo,
        )
        runner.tracker.limit = script.max_steps
        self._runner = runner
        _active = self
        self._new_run()
        self._boundary = BoundaryClock(self.pace)
        # Each run from its own baseline: the heap the last one freed goes back to the
        # system, its readers start afresh, and the kernel's peak RSS starts from now
        # (the window's own, or a run before, is not this run's peak).
        trim_heap()
        for backend in self.backends:
            backend.new_run()
        reset_peak_rss()
        self.sampler.start()
        self.find_accelerators()  # after the sampler: host memory is drawn meanwhile
        self._report_capacity()
        try:
            return runner.run()
        finally:
            self.steps_seen = runner.steps
            self.sampler.stop()
            if not self._abandoned:
                self.sampler.sample()  # pending boundaries, then the state after the script
            self._runner = None
            if not self._abandoned:
                trim_heap()  # what the run freed, back to the system (not kept by malloc)
            self._abandoned = False  # this source can run again
            if _active is self:
                _active = None

    def watch_thread(
        self,
        thread_ident: int | None = None,
        script: str | None = None,
        step_limit: int | None = None,
    ) -> None:
        """Monitor code already running in this process, in ``thread_ident`` (the caller's
        by default): step hooks, boundary readings, censuses and stop, as for a run. With
        ``step_limit``, the thread exits (SystemExit 0) at the end of that step."""
        if self._runner is not None:
            raise RuntimeError("this source already monitors a run")
        ident = thread_ident if thread_ident is not None else threading.get_ident()
        tracker = StepTracker(self.emit, self.session.now)
        tracker.limit = step_limit
        tracker.install(ident)
        self._runner = WatchedThread(tracker, ident, script)
        self._new_run()
        self.sampler.start()
        self.find_accelerators()
        self._report_capacity()

    def _feed_leaks(self, event: Event) -> None:
        # Only this process's own runs: the window's Session also carries isolated and
        # attached runs, whose agents judge them (a second detector here raised a second
        # alert for one leak, judged against this machine's RAM).
        if self._runner is not None and not self._abandoned:
            if isinstance(event, Sample) and not event.values.keys() <= self._keys_seen:
                self._note_devices(event)
            self.leaks.on_event(event)

    def _note_devices(self, sample: Sample) -> None:
        # A reading names a series first (a few times a run): a device the script began
        # to use, whose total memory can be read now.
        self._keys_seen |= sample.values.keys()
        self._report_capacity()

    @property
    def abandoned(self) -> bool:
        """True while an abandoned run still occupies this source (see :meth:`abandon`)."""
        return self._abandoned

    def abandon(self) -> None:
        """Let go of a run that cannot be stopped (its thread is blocked in a C call).

        Python cannot interrupt a thread inside a C call, so the script's thread lives on
        until the call returns; from now on its events are dropped and sampling stops, so
        that whatever the Session shows next is not mixed with it. :attr:`running` stays
        True until that thread ends.
        """
        if self._runner is None:
            return
        self._abandoned = True
        self.sampler.stop()

    def emit(self, event: Event) -> None:
        """The runner's events go to the Session; step boundaries may take a census."""
        if self._abandoned:
            return
        self.session.submit(event)
        if isinstance(event, Marker) and event.kind is MarkerKind.STEP:
            self.pace.on_step(event.t)
            if self._boundary.due():
                started = time.thread_time()  # CPU work, not waiting for the GIL
                self.sampler.record_boundary(event.step)
                self._boundary.cost(time.thread_time() - started)
            if self._census_wanted.is_set():
                self._census_wanted.clear()
                self._census_reply = self._boundary_census("user", event.step)
                self._census_done.set()
            elif self._census_failed:  # said once; the run goes on without them
                return
            elif self.leaks.census_due(event.step):
                self._boundary_census("leak", event.step)
            elif self.census_schedule.on_step(event.step):
                self._boundary_census("step", event.step)

    def _boundary_census(self, trigger: str, step: int | None) -> CensusTaken | None:
        """A census in the script's own thread, at its step boundary: whatever goes wrong
        in it is torchmem's problem, never the script's. The first failure is said in the
        log, and automatic censuses stop for the run (a user's request still tries)."""
        try:
            return self.census(trigger, step)
        except Exception as exc:  # an exception here would end the user's run
            self._census_error = error_line(exc)
            if not self._census_failed:
                self._census_failed = True
                self.session.note(
                    f"a census failed at step {step} ({self._census_error}); the script "
                    "goes on, without automatic censuses for this run."
                )
            return None

    def request_census(self, wait_s: float = 2.0) -> CensusTaken:
        """A census for a user: at the script's next step boundary if it steps soon.

        At a step boundary every iteration is at the same point (activations freed, the
        step's state settled) and the script's own thread names its variables. A script
        that does not step within ``wait_s`` is counted from the calling thread.
        """
        if self._runner is not None:
            self._census_done.clear()
            self._census_wanted.set()
            landed = self._census_done.wait(wait_s)
            if not landed:
                self._census_wanted.clear()
                landed = self._census_done.is_set()  # it landed just now
            if landed:
                if self._census_reply is None:
                    raise CensusFailed(self._census_error)
                return self._census_reply
        return self.census("user")

    def census(self, trigger: str = "user", step: int | None = None) -> CensusTaken:
        """Take a census of this process's tensors now and submit it to the Session.

        Variables of the running script name its tensors: from its own frames when called
        in its thread, from a snapshot of that thread's frames otherwise.
        """
        runner = self._runner
        namespaces = (
            script_namespaces(runner.thread_ident, runner.script)
            if runner is not None and runner.thread_ident is not None
            else []
        )
        step = self.steps if step is None else step
        result = take_census(namespaces, step=step)
        namespaces.clear()
        if trigger == "step":
            self.census_schedule.record(step, result.duration_s)
        event = CensusTaken(self.session.now(), step, result, trigger)
        self.session.submit(event)
        return event

    @property
    def running(self) -> bool:
        """True while a script runs."""
        return self._runner is not None

    @property
    def steps(self) -> int:
        """Steps of the current run (0 when none)."""
        return self._runner.steps if self._runner else 0

    def request_stop(self, grace_s: float = 2.0) -> None:
        """Stop the running script cooperatively (see :meth:`ScriptRunner.request_stop`)."""
        runner = self._runner
        if isinstance(runner, ScriptRunner):
            runner.request_stop(grace_s)
        elif runner is not None:
            runner.request_stop()

    def close(self) -> None:
        """Stop sampling."""
        self.sampler.stop()

    # -- commands ------------------------------------------------------------------------
    def command(self, name: str) -> list[CommandResult]:
        """Run a measured command by name; its result is submitted to the Session and
        returned (one, as this is one process)."""
        now = self.session.now
        handler = self._handlers.get(name)
        if handler is None:
            result = CommandResult(now(), name, False, f"unknown command {name!r}")
        else:
            result = handler(now)
        self.session.submit(result)
        self.sampler.sample()  # show the effect on the traces at once
        return [result]

    def _census_command(self, now: Callable[[], float]) -> CommandResult:
        try:
            taken = self.request_census()
        except Exception as exc:  # said in the result, as every command's failure is
            text = str(exc) if isinstance(exc, CensusFailed) else f"{type(exc).__name__}: {exc}"
            return CommandResult(now(), "census", False, f"the census failed: {text}")
        _, previous = self.session.censuses()
        message = describe_census(taken.census, previous.census if previous else None)
        return CommandResult(now(), "census", True, message)

    def _history(self, now: Callable[[], float], record: bool) -> CommandResult:
        result = allocation_history(self.backends, now, record=record)
        if result.ok:
            self._history_on = record
        return result

    def _on_oom(self, exc: BaseException) -> None:
        """An out-of-memory error ended the script: take the census now, from the frames
        the error went through (their tensors die with the traceback), and, where the user
        records CUDA allocation history, the memory snapshot of that moment."""
        runner = self._runner
        script = runner.script if runner is not None else None
        namespaces = traceback_namespaces(exc.__traceback__, script)
        try:
            result = take_census(namespaces, step=self.steps)
        finally:
            namespaces.clear()
        self.session.submit(CensusTaken(self.session.now(), self.steps, result, "oom"))
        if self._history_on:
            self.session.submit(
                save_snapshot(self.backends, self.session.now, snapshot_dir(), self._snapshot_names)
            )

    def _snapshot_names(self) -> list[dict[str, Any]]:
        """The accelerator storages of the newest censuses, by address, with the Unix
        time each census was taken (in µs, the clock of a snapshot's ``time_us``)."""
        out = []
        unix_at_zero = time.time() - self.session.now()  # the Session's clock to Unix time
        for event in reversed([e for e in self.session.censuses() if e is not None]):
            unix_us = int((unix_at_zero + event.t) * 1e6)
            storages = [
                [s.device, s.key[1], s.nbytes, s.name, s.kind]
                for s in event.census.storages.values()
                if s.device != "cpu"
            ]
            if storages:
                out.append({"unix_us": unix_us, "step": event.step, "storages": storages})
        return out

    def _reset_peaks(self, now: Callable[[], float]) -> CommandResult:
        peaks = {k: p for k, (_, p) in self.session.latest().items()}
        return reset_peaks(self.backends, now, peaks)

    def referrers(self, tensor: TensorInfo, scope: str = "") -> dict[str, Any]:
        """What keeps a tensor of this process's latest census alive."""
        return referrers_of(tensor)

    def set_rate(self, hz: float) -> None:
        """Sample this many times a second."""
        self.sampler.set_rate(hz)

    # -- leak detection and censuses, as the user sets them -------------------------------
    @property
    def leak_settings(self) -> LeakSettings:
        """The thresholds this process's runs are judged by."""
        return self.leaks.settings

    def configure_leaks(self, settings: LeakSettings) -> None:
        """Judge this process's runs by ``settings`` from now on."""
        self.leaks.settings = settings

    def set_auto_census(self, enabled: bool) -> None:
        """Take censuses at step boundaries on a schedule (or only when asked)."""
        self.census_schedule.enabled = enabled


class BoundaryClock:
    """Which step boundaries get a reading: every one, unless that costs > 1 % of a step.

    A boundary reading (RSS and accelerator counters) takes some tens of microseconds;
    for very short steps only every k-th boundary is read, k chosen from the measured
    step time and reading cost.
    """

    BUDGET = 0.01

    def __init__(self, pace: StepPace) -> None:
        self.pace = pace
        self.read_cost = 0.0
        self._skipped = 0
        self._costs: deque[float] = deque(maxlen=15)

    def due(self) -> bool:
        """True when this step boundary gets a reading (the pace is fed by the caller)."""
        step_time = self.pace.step_time
        every = 1
        if step_time and self.read_cost:
            every = max(1, math.ceil(self.read_cost / (self.BUDGET * step_time)))
        self._skipped += 1
        if self._skipped >= every:
            self._skipped = 0
            return True
        return False

    def cost(self, seconds: float) -> None:
        """Record what one boundary reading took (CPU seconds of the script's thread)."""
        # The median of the last readings: a reading that happened to run a garbage
        # collection of a large heap (tens of ms) or a lazy import must not throttle the
        # next ones. A moving average let such spikes space readings 10 to 20 steps apart
        # in the window's process late in a long test run, and its leak went unreported.
        self._costs.append(seconds)
        self.read_cost = sorted(self._costs)[(len(self._costs) - 1) // 2]  # the lower one
