"""The Session: the one place where events land, whatever source they came from.

Sources call :meth:`Session.submit` from any thread. The Session updates its models
(time series, a job's totals, step clock, markers, log, run state) under a lock, bumps
``revision`` and tells its listeners. Views read snapshots; they never receive data by another path.
Script output leaves ``revision`` alone: only the Log pane shows it, from the events, and
a printing script would otherwise redraw every trace at the bridge's full rate.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from torchmem.events import (
    Alert,
    AlertState,
    CapacityKnown,
    CensusTaken,
    CommandResult,
    Event,
    JobMembers,
    LogRecord,
    Marker,
    MarkerKind,
    RunFinished,
    RunStarted,
    Sample,
    Stream,
)
from torchmem.job_totals import JobTotals
from torchmem.retry_streaks import RetryStreaks
from torchmem.series import (
    KERNEL_PEAK,
    ProcessDevice,
    SeriesName,
    device_order,
    is_sum_scope,
    scope_label,
    scope_order,
    scoped,
    split_device,
    split_key,
    split_scope,
)
from torchmem.timeseries import SeriesBuffer, StepClock, append_readings

Listener = Callable[[Event], None]
log = logging.getLogger(__name__)


def error_line(exc: BaseException) -> str:
    """An exception as the run's log says it: its type and the first line of its message."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


class Session:
    """Everything known about one monitored run, bounded in memory."""

    def __init__(self, recent: int = 6000, buckets: int = 2048, max_log: int = 20000) -> None:
        self._lock = threading.RLock()
        self._listeners: list[Listener] = []
        self._failed_listeners: set[str] = set()
        # Per thread: the events waiting for their listeners while one is dispatched.
        self._dispatching = threading.local()
        self._recent, self._buckets = recent, buckets
        self._max_log = max_log
        self.t0 = time.monotonic()
        #: Alert keys the user muted: their alerts are dropped on arrival, whoever raised
        #: them (this process's detector or an attached agent). Kept across runs.
        self.muted: set[str] = set()
        self._init_state()

    def _init_state(self) -> None:
        self.series: dict[str, SeriesBuffer] = {}
        self.steps = StepClock()
        self._retries = RetryStreaks()
        #: A job's totals (``total/cpu/rss``), derived here from its processes' samples.
        self._job = JobTotals()
        #: Total bytes per device, the union of every CapacityKnown (``cuda:0``,
        #: ``rank1/cuda:1``, ``cpu``).
        self._capacity: dict[str, int] = {}
        self.markers: deque[Marker] = deque(maxlen=5000)
        self.logs: deque[LogRecord] = deque(maxlen=self._max_log)
        self.commands: deque[CommandResult] = deque(maxlen=500)
        self.run_started: RunStarted | None = None
        self.run_finished: RunFinished | None = None
        self.samples = 0
        self.revision = 0
        self.alerts: dict[str, Alert] = {}  # key -> latest state (active or resolved)
        self.alert_log: deque[Alert] = deque(maxlen=2000)  # every raise, update, resolve
        self.census: CensusTaken | None = None  # the newest, of any process
        # Per process scope ("" alone, "rank1" in a job): its newest census and the one
        # before (in a job the ranks' censuses come in turn: what changed is per rank).
        self._censuses_of: dict[str, tuple[CensusTaken, CensusTaken | None]] = {}
        # (t, step, {device: {kind: bytes}}) per census: the breakdown chart's data.
        self.census_history: deque[tuple[float, int, dict[ProcessDevice, dict[str, int]]]] = deque(
            maxlen=5000
        )

    # -- time -------------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the session (re)started: the time base of every event."""
        return time.monotonic() - self.t0

    def note(self, text: str) -> None:
        """Say something in the run's log as torchmem (not the script)."""
        self.submit(LogRecord(self.now(), Stream.TORCHMEM, text))

    def align_clock(self, now: float) -> None:
        """Make :meth:`now` read ``now`` at this instant: an attached process's clock
        becomes the Session's, so its history keeps its own times."""
        with self._lock:
            self.t0 = time.monotonic() - now

    def reset(self) -> None:
        """Forget everything and restart the clock (a new run in the same window)."""
        with self._lock:
            self.t0 = time.monotonic()
            self._init_state()

    def load_history(self, series: dict[str, SeriesBuffer], steps: StepClock, samples: int) -> None:
        """Take the series and step clock of a long recording whole (the one bulk path
        into a Session: replaying a week of samples one event at a time takes minutes).
        Views see it as any change: the revision moves."""
        with self._lock:
            self.series = dict(series)
            self.steps = steps
            self.samples = samples
            self.revision += 1

    # -- events -----------------------------------------------------------------------
    def mute(self, key: str) -> None:
        """Stop showing alerts with this key (``leak:cpu/rss``): the current one goes, and
        later ones are dropped on arrival."""
        with self._lock:
            self.muted.add(key)
            self.alerts.pop(key, None)
            kept = [a for a in self.alert_log if a.session_key != key]
            self.alert_log = deque(kept, maxlen=self.alert_log.maxlen)
            self.revision += 1

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` after each event is applied; returns an unsubscribe."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def submit(self, event: Event) -> None:
        """Apply one event from any source and notify listeners (on the caller's thread).

        An event submitted by a listener (an alert a sample raised) is applied at once but
        heard after every listener has heard the event being dispatched: each listener
        sees events in the order they happened. A nested dispatch would hand the recorder
        an alert before the sample that raised it.
        """
        if isinstance(event, Alert) and event.session_key in self.muted:
            return
        with self._lock:
            self._apply(event)
            if not isinstance(event, LogRecord):
                self.revision += 1
            listeners = tuple(self._listeners)
        pending: deque[tuple[Event, tuple[Listener, ...]]] | None = getattr(
            self._dispatching, "pending", None
        )
        if pending is not None:
            pending.append((event, listeners))
            return
        pending = self._dispatching.pending = deque([(event, listeners)])
        try:
            while pending:
                event, listeners = pending.popleft()
                for listener in listeners:
                    try:
                        listener(event)
                    except Exception as exc:  # raised into a source's thread: the user's loop
                        self._listener_failed(listener, exc)
        finally:
            self._dispatching.pending = None

    def _listener_failed(self, listener: Listener, exc: Exception) -> None:
        """A model or view that raised on an event is torchmem's bug, never the run's: the
        event was applied and the other listeners got it; the first traceback of each
        listener goes to Python's ``logging`` (the terminal), and the run's log says it.

        Events are submitted from the script's own thread at its step boundaries, and from
        the sampler's thread: an exception let through would end the user's training (or
        stop the sampling) for a bug in, say, the leak detector.
        """
        name = getattr(listener, "__qualname__", type(listener).__name__)
        with self._lock:
            first = name not in self._failed_listeners
            self._failed_listeners.add(name)
        if not first:
            log.debug("torchmem: %s failed again", name, exc_info=exc)
            return
        log.error("torchmem: %s failed on an event", name, exc_info=exc)
        text = error_line(exc)
        self.note(f"internal error in {name} ({text}); the run goes on. Please report it.")

    def _apply(self, event: Event) -> None:
        if isinstance(event, Sample):
            self.samples += 1
            series = event.series()
            for values in (series, self._job.fold(event)):
                append_readings(self.series, event.t, values, self._recent, self._buckets)
            if event.step is not None:
                self._retries.on_boundary(event.step, series)
        elif isinstance(event, Marker):
            if event.kind is MarkerKind.STEP:
                self.steps.add(event.t, event.step)
            else:
                self.markers.append(event)
        elif isinstance(event, LogRecord):
            self.logs.append(event)
        elif isinstance(event, RunStarted):
            self.run_started, self.run_finished = event, None
        elif isinstance(event, RunFinished):
            self.run_finished = event
        elif isinstance(event, Alert):
            self.alerts[event.session_key] = event
            self.alert_log.append(event)
        elif isinstance(event, CensusTaken):
            before = self._censuses_of.get(event.scope)
            self.census = event
            self._censuses_of[event.scope] = (event, before[0] if before else None)
            census = event.census
            by_device = {
                ProcessDevice(event.scope, device): census.bytes_by_kind(device)
                for device in census.devices()
            }
            self.census_history.append((event.t, event.step, by_device))
        elif isinstance(event, CapacityKnown):
            self._capacity.update(event.devices())
        elif isinstance(event, JobMembers):
            self._job.on_members(event)
        elif isinstance(event, CommandResult):
            self.commands.append(event)
            if event.command == "reset_peaks" and event.ok:
                for buf in self.series.values():
                    buf.reset_peak()

    # -- snapshots for views ----------------------------------------------------------
    def keys(self) -> list[str]:
        """Series keys in the order they first appeared."""
        with self._lock:
            return list(self.series)

    def name(self, key: str) -> SeriesName:
        """What series ``key`` is: its process's scope, device and metric."""
        return SeriesName.of(key)

    def capacity_of(self, name: SeriesName) -> int | None:
        """The total memory of the device series ``name`` is of, as its process's source
        reported it (the RAM for ``system/available``, a share of it as the RSS is)."""
        device = "cpu" if name.device == "system" else name.device
        with self._lock:
            return self._capacity.get(scoped(name.scope, device))

    def arrays(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Times and values of one series for drawing (copies)."""
        with self._lock:
            return self.series[key].arrays()

    def to_steps(self, t: np.ndarray) -> np.ndarray:
        """Map session times to step positions."""
        with self._lock:
            return self.steps.to_steps(t)

    def _peak(self, key: str, buf: SeriesBuffer) -> float:
        """A series' peak; for a process's RSS, the kernel's high-water mark where it is
        higher (a burst between two samples). Not for a sum of processes: the sum of
        their peaks is not the peak of their sum. Called with the lock held."""
        device, metric = split_key(key)
        if metric == "rss" and not is_sum_scope(split_scope(key)[0]):
            hwm = self.series.get(f"{device}/{KERNEL_PEAK}")
            if hwm is not None and hwm.count and math.isfinite(hwm.last):
                return max(buf.peak, hwm.last)
        return buf.peak

    def kernel_peaks(self) -> dict[str, float]:
        """The RSS series whose peak is the kernel's high-water mark, above every sample
        of it: ``{"cpu/rss": bytes}``. Views say where a peak comes from."""
        with self._lock:
            return {
                key: peak
                for key, buf in self.series.items()
                if split_key(key)[1] == "rss" and (peak := self._peak(key, buf)) > buf.peak
            }

    def latest(self) -> dict[str, tuple[float, float]]:
        """Last value and peak of every series."""
        with self._lock:
            return {k: (b.last, self._peak(k, b)) for k, b in self.series.items()}

    def latest_timed(self) -> dict[str, tuple[float, float, float]]:
        """Last value, peak and the time of the last reading of every series: a reading
        older than its neighbours is stale, and views say so."""
        with self._lock:
            return {k: (b.last, self._peak(k, b), float(b.last_t)) for k, b in self.series.items()}

    def _series_of(self, scope: str | None) -> list[tuple[str, str, str, SeriesBuffer]]:
        """(key, device, metric, buffer) of every series, the device with its process's
        scope (``rank1/cuda:1``); or of the process or sum ``scope`` alone (``""``: a
        single process's), the device named within it (``cuda:1``). Called with the lock
        held."""
        rows = []
        for key, buf in self.series.items():
            owner, inner = split_scope(key)
            if scope is None or owner == scope:
                rows.append((key, *split_key(key if scope is None else inner), buf))
        return rows

    def peak_bytes(self, scope: str | None = None) -> dict[str, float]:
        """Peak per device for summaries: accelerator peak allocated, and ``cpu_rss``
        (``rank1/cpu_rss`` for a rank of a job); with ``scope``, that process's alone,
        named within it (``cpu_rss``)."""
        with self._lock:
            peaks: dict[str, float] = {}
            for key, device, metric, buf in self._series_of(scope):
                if metric == "rss":
                    peaks[f"{device}_rss"] = self._peak(key, buf)
                elif metric in ("peak_allocated", "allocated") and buf.count:
                    peaks[device] = max(peaks.get(device, 0.0), buf.peak)
        return dict(sorted(peaks.items(), key=lambda kv: device_order(kv[0])))

    def peaks_of(self, metric: str, scope: str | None = None) -> dict[str, int]:
        """The highest reading of ``metric`` per device (``{"cuda:0": ...}`` for
        ``reserved``), over the whole run (buckets keep every peak); with ``scope``, of
        that process alone (``rank1``: its ``cuda:1``)."""
        with self._lock:
            return {
                device: int(buf.peak)
                for _, device, m, buf in self._series_of(scope)
                if m == metric and buf.count
            }

    def capacity(self) -> dict[str, int]:
        """Total memory per device, as the run's sources reported it (a copy)."""
        with self._lock:
            return dict(self._capacity)

    def retry_streaks(self) -> dict[str, int]:
        """The longest run of consecutive steps with allocator retries per device, where
        the run read the retry count at its step boundaries (a tuning trial)."""
        with self._lock:
            return self._retries.longest()

    def censuses(self, scope: str | None = None) -> tuple[CensusTaken | None, CensusTaken | None]:
        """The latest census event and the one before it of the same process; with
        ``scope`` (``rank1`` in a job), that process's."""
        with self._lock:
            if scope is None:
                if self.census is None:
                    return None, None
                scope = self.census.scope
            return self._censuses_of.get(scope, (None, None))

    def scopes(self) -> list[str]:
        """The processes of a job that have series (``rank0``, ``pid4242``), in rank
        order, then each machine's total (``@node1``) and the job's (``total``); empty
        for a single process. The one order every view lists them in."""
        with self._lock:
            found = {split_scope(key)[0] for key in self.series}
        found.discard("")
        return sorted(found, key=scope_order)

    def holds_tensors(self, scope: str) -> bool:
        """True for a process's scope (``rank1``, or ``""`` alone), which has censuses of
        its own; False for the sums torchmem adds up (``total``, ``@node1``)."""
        return not is_sum_scope(scope)

    def breakdown(self) -> list[tuple[float, int, dict[ProcessDevice, dict[str, int]]]]:
        """Bytes by kind per device of each process for every census so far, oldest
        first."""
        with self._lock:
            return list(self.census_history)

    def raised_alerts(self) -> list[Alert]:
        """Every alert event that raised or updated an alert, oldest first."""
        with self._lock:
            return [a for a in self.alert_log if a.state is AlertState.ACTIVE]

    def alert_list(self) -> list[Alert]:
        """Latest state of every alert raised so far, the most recently raised first: an
        update (every step of a leak) does not move an older alert above a newer one."""
        with self._lock:
            return list(reversed(self.alerts.values()))  # a dict keeps the order of raising

    def user_markers(self) -> list[Marker]:
        """User and epoch markers, oldest first."""
        with self._lock:
            return list(self.markers)


def peak_label(key: str) -> str:
    """How a :meth:`Session.peak_bytes` key reads to a user: ``cpu_rss`` is "RSS", a
    device keeps its name, a process of a job says which (``rank2/cpu_rss``: "rank 2 RSS",
    ``total/cuda:0``: "total cuda:0")."""
    scope, name = split_device(key)
    label = "RSS" if name == "cpu_rss" else name
    return f"{scope_label(scope)} {label}" if scope else label
