"""Leak and capacity alerts: memory that grows step after step (or over time), and who grows.

The detector is a core model fed by the Session's events. It measures at step boundaries
(samples tagged with a step, taken at the same point of every iteration), ignores a
warm-up, and decides growth with a robust trend test over a sliding window: the
Theil-Sen slope (median of pairwise slopes, indifferent to spikes) and the Mann-Kendall
test (is the rise monotonic beyond chance?). Growth must be significant, at least an
absolute and a relative amount per step, and sustained over a minimum number of steps.

To name the culprits it asks for censuses (spaced out) while growth is suspected and
hands them to :mod:`torchmem.leaks.culprits`; the statistics live in
:mod:`torchmem.leaks.stats`. Each alert fires once per key, is updated in place while its
condition lasts, and resolves when it ends.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from torchmem.events import (
    Alert,
    AlertKind,
    AlertState,
    CapacityKnown,
    CensusTaken,
    Event,
    Marker,
    MarkerKind,
    RunStarted,
    Sample,
    Severity,
)
from torchmem.leaks.advice import (
    SUGGEST_CACHE,
    SUGGEST_CAPACITY,
    SUGGEST_NOT_TENSORS,
    SUGGEST_RETRIES,
    SUGGEST_WORKERS,
)
from torchmem.leaks.culprits import (
    CensusGroup,
    describe_culprit,
    find_culprits,
    group_census,
    suggestion_for,
)
from torchmem.leaks.stats import mann_kendall_p, theil_sen, trailing_floor
from torchmem.series import series_label, split_key
from torchmem.units import format_bytes

MiB = 1 << 20
# The trend tests (about 40 us a series) may take this share of a core, counted in this
# thread's CPU time since the run started (wall time would count the waits for the GIL,
# which in the window's process starved the tests): every reading is tested while that
# holds. A limit in wall time instead (at most every 50 ms) left a leak found 3 to 6
# readings late, 10 steps, when steps took 5 ms. Over budget, a series is still tested at
# least every EVALUATE_AT_LEAST_S.
EVALUATE_BUDGET = 0.005
EVALUATE_AT_LEAST_S = 0.25
# The trend is tested on the floor of the readings (a trailing minimum over this many
# boundaries): a leak raises the floor, a transient (an evaluation pass, a big batch that
# the allocator keeps for a few steps) does not.
FLOOR_SPAN = 4
# Process RSS creeps in a healthy run: the C heap grows in 2 MiB jumps as threads' arenas
# fragment. Twelve runs of a plateaued cache under load crept up to 1.2 MiB/step for 17
# steps (and once 1.83), so RSS must grow this many times the threshold (a 1 MiB/step
# leak of tensors still shows in allocated memory on accelerators, where readings are
# exact). Where malloc tells its free bytes (glibc), the trend is of RSS net of them,
# which removes that creep at its source; the margin stays for the rest (Python's own
# arenas, other allocators).
RSS_MARGIN = 1.5

# What child processes hold of their own (cpu/children: their USS) is read every 2 s, not
# at step boundaries, so its trend is over time: the newest CHILDREN_WINDOW readings, at
# least CHILDREN_MIN_READINGS of them, must rise significantly by CHILDREN_MIN_RISE. A
# dataset of a million captions in a list, read by two shuffling workers, rose 36 -> 306
# MiB in 21 s and then held it (each worker had copied the whole list); the same dataset
# as one numpy array held 17-18 MiB for two epochs.
CHILDREN_KEY = "cpu/children"  # the detector watches its own process: no rank scope
CHILDREN_WINDOW = 30
CHILDREN_MIN_READINGS = 8
CHILDREN_MIN_RISE = 64 * MiB


def _net(key: str, value: float, values: dict[str, float]) -> tuple[float, bool]:
    """The reading of ``key`` the trends are tested on, and whether it was netted: process
    RSS less what malloc holds free (no leak: torchmem.probe.heap), where the same reading
    has it; others as read."""
    device, metric = split_key(key)
    free = values.get(f"{device}/heap_free") if metric == "rss" else None
    return (value, False) if free is None else (value - free, True)


@dataclass
class LeakSettings:
    """Thresholds of the detector; every one can be changed by the user."""

    warmup_steps: int = 5
    window: int = 40
    min_steps: int = 20
    abs_per_step: float = 1 * MiB
    rel_per_step: float = 0.001
    p_value: float = 0.01
    resolve_after: int = 15
    capacity_warning: float = 0.80
    capacity_critical: float = 0.95
    census_every: int = 4
    max_culprit_censuses: int = 4


class _Trend:
    """Boundary readings of one series and the state of its alert."""

    def __init__(self, window: int) -> None:
        self.steps: deque[float] = deque(maxlen=window)
        self.values: deque[float] = deque(maxlen=window)
        self.times: deque[float] = deque(maxlen=window)
        self.alert: Alert | None = None
        self.quiet = 0
        self.updates = 0
        self.evaluated_at = -1e9
        #: Whether the readings are RSS net of the C heap's free bytes (None: none yet).
        self.netted: bool | None = None
        #: Child processes' memory: where the alerted rise started, and its top so far.
        self.rise_start = 0.0
        self.rise_peak = 0.0

    def clear(self) -> None:
        """Forget the readings (they were of another quantity, or of processes now gone)."""
        self.steps.clear()
        self.values.clear()
        self.times.clear()

    def make_alert(
        self,
        sample: Sample,
        key: str,
        kind: AlertKind,
        severity: Severity,
        series: str,
        message: str,
        suggestion: str,
        per_step: float,
        per_minute: float,
        culprits: tuple[dict[str, Any], ...] = (),
    ) -> Alert:
        """An active alert over these readings; an update keeps the first and raised steps
        of the alert it replaces."""
        previous = self.alert
        return Alert(
            t=sample.t,
            key=key,
            kind=kind,
            severity=severity,
            state=AlertState.ACTIVE,
            series=series,
            first_step=previous.first_step if previous else int(self.steps[0]),
            step=int(self.steps[-1]),
            message=message,
            suggestion=suggestion,
            per_step=per_step,
            per_minute=per_minute,
            culprits=culprits,
            raised_step=previous.raised_step if previous else int(self.steps[-1]),
        )


class LeakDetector:
    """Watches a Session and submits :class:`Alert` events to it."""

    def __init__(
        self,
        submit: Callable[[Event], None],
        capacity: dict[str, int] | None = None,
        settings: LeakSettings | None = None,
    ) -> None:
        self.submit = submit
        self.capacity = capacity or {}
        self.settings = settings or LeakSettings()
        self._reset()
        theil_sen(np.arange(3.0), np.arange(3.0))  # numpy loads median's helpers lazily

    def _reset(self) -> None:
        self._trends: dict[str, _Trend] = {}
        self._children: dict[str, _Trend] = {}
        self._tables: deque[tuple[int, dict[tuple, CensusGroup]]] = deque(maxlen=6)
        self._tensor_bytes: deque[tuple[int, int]] = deque(maxlen=6)
        self._culprits: list[dict[str, Any]] = []
        self._suspected = False
        self._culprit_censuses = 0
        self._last_census_step = -(10**9)
        self._epoch_starts: dict[str, list[float]] = {}
        self._latest: dict[str, float] = {}
        self._active: dict[str, Alert] = {}
        self._last_step = 0
        self._evaluate_spent = 0.0
        self._evaluate_since: float | None = None

    # -- the source asks -------------------------------------------------------------------
    def census_due(self, step: int) -> bool:
        """True when growth is suspected and a culprit census is due at ``step``."""
        s = self.settings
        return (
            self._suspected
            and self._culprit_censuses < s.max_culprit_censuses
            and step - self._last_census_step >= s.census_every
        )

    # -- events ------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        """Feed one Session event (call from a Session listener)."""
        if isinstance(event, Sample):
            self._latest.update(event.values)
            self._check_capacity(event)
            children = event.values.get(CHILDREN_KEY)
            if children is not None:  # every 2 s, never at a step boundary
                self._on_children(CHILDREN_KEY, children, event)
            if event.step is not None:
                self._on_boundary(event)
        elif isinstance(event, CensusTaken):
            self._on_census(event)
        elif isinstance(event, Marker) and event.kind is MarkerKind.EPOCH:
            self._on_epoch(event)
        elif isinstance(event, RunStarted):
            self._reset()
        elif isinstance(event, CapacityKnown):  # the machine's, kept across runs
            self.capacity.update(event.capacity)

    def _tracked(self, key: str) -> bool:
        metric = split_key(key)[1]
        return metric in ("allocated", "rss", "reserved")

    def _on_boundary(self, sample: Sample) -> None:
        s = self.settings
        step = sample.step or 0
        self._last_step = step
        if step < s.warmup_steps:
            return
        if self._evaluate_since is None:
            self._evaluate_since = sample.t - 1.0  # a second's budget to begin with
        budget = EVALUATE_BUDGET * (sample.t - self._evaluate_since)
        for key, value in sample.values.items():
            if not self._tracked(key):
                continue
            value, netted = _net(key, value, sample.values)
            trend = self._trends.get(key)
            if trend is None:
                trend = self._trends[key] = _Trend(s.window)
            if trend.netted is not None and netted != trend.netted:
                # The free bytes stopped coming (too costly to read in this process): the
                # readings before are of another quantity, so the trend starts again.
                trend.clear()
            trend.netted = netted
            trend.steps.append(float(step))
            trend.values.append(value)
            trend.times.append(sample.t)
            if self._evaluate_spent <= budget or sample.t - trend.evaluated_at >= (
                EVALUATE_AT_LEAST_S
            ):
                started = time.thread_time()
                trend.evaluated_at = sample.t
                self._evaluate(key, trend, sample)
                self._evaluate_spent += time.thread_time() - started

    def _evaluate(self, key: str, trend: _Trend, sample: Sample) -> None:
        s = self.settings
        x = np.fromiter(trend.steps, float)
        if len(x) < 6 or x[-1] - x[0] < s.min_steps:
            return
        y, where = trailing_floor(np.fromiter(trend.values, float), FLOOR_SPAN)
        x = x[where]  # each floor at the step it was read
        slope = theil_sen(x, y)
        p = mann_kendall_p(y)
        margin = RSS_MARGIN if split_key(key)[1] == "rss" else 1.0
        threshold = max(s.abs_per_step * margin, s.rel_per_step * float(np.median(y)))
        growing = p < s.p_value and slope >= threshold
        if growing:
            # Sustained: the newer half must still rise. A cache that filled and plateaued,
            # or a high-water mark that jumped once, rises only in the older half.
            half = len(x) // 2
            growing = theil_sen(x[half:], y[half:]) >= threshold and mann_kendall_p(y[half:]) < 0.05
        if p < 0.05 and slope >= threshold:
            # Suspected: take (a few, spaced) censuses now, to name the culprits by the
            # time the growth is confirmed.
            self._suspected = True
        metric = split_key(key)[1]
        if metric == "reserved":
            self._evaluate_cache(key, trend, growing, slope, sample)
            return
        if growing:
            trend.quiet = 0
            self._raise_leak(key, trend, slope, sample)
        elif trend.alert is not None:
            trend.quiet += 1
            if trend.quiet >= s.resolve_after:
                self._resolve(trend, sample)

    # -- child processes -----------------------------------------------------------------
    def _on_children(self, key: str, value: float, sample: Sample) -> None:
        """A reading of what the process's children hold of their own (every 2 s)."""
        trend = self._children.get(key)
        if trend is None:
            trend = self._children[key] = _Trend(CHILDREN_WINDOW)
        if value <= 0:  # the children are gone (a zero once, then nothing)
            trend.clear()
            self._resolve(trend, sample, "the child processes ended")
            return
        trend.steps.append(float(self._last_step))
        trend.values.append(value)
        trend.times.append(sample.t)
        if trend.alert is None:
            self._evaluate_children(key, trend, sample)
            return
        # Active while the memory is held: a copy that stopped growing is still a copy. It
        # resolves once the children hold less than half of what they gained for a while
        # (workers restarted each epoch copy again within seconds: that keeps it).
        if value < trend.rise_start + 0.5 * (trend.rise_peak - trend.rise_start):
            trend.quiet += 1
            if trend.quiet >= self.settings.resolve_after:
                self._resolve(trend, sample, "released")
            return
        trend.quiet = 0
        if value > 1.1 * trend.rise_peak:  # still rising: say how far
            trend.rise_peak = value
            self._raise_children(key, trend, sample, trend.alert.per_minute / 60)

    def _evaluate_children(self, key: str, trend: _Trend, sample: Sample) -> None:
        if len(trend.values) < CHILDREN_MIN_READINGS:
            return
        t = np.fromiter(trend.times, float)
        y = np.fromiter(trend.values, float)
        slope = theil_sen(t, y)  # bytes per second
        if slope * (t[-1] - t[0]) < CHILDREN_MIN_RISE or mann_kendall_p(y) >= self.settings.p_value:
            return
        half = len(y) // 2
        if theil_sen(t[half:], y[half:]) <= 0:
            return  # a rise that is over (a worker that loaded its shard once)
        trend.rise_start, trend.rise_peak = float(y.min()), float(y.max())
        self._raise_children(key, trend, sample, slope)

    def _raise_children(self, key: str, trend: _Trend, sample: Sample, slope: float) -> None:
        steps = trend.steps[-1] - trend.steps[0]
        seconds = trend.times[-1] - trend.times[0]
        message = (
            f"{series_label(key)} hold more and more memory of their own: "
            f"{format_bytes(trend.rise_start)} -> {format_bytes(trend.rise_peak)} "
            f"({format_bytes(slope * 60, signed=True)}/min while rising)"
        )
        alert = trend.make_alert(
            sample, f"worker_growth:{key}", AlertKind.WORKER_GROWTH, Severity.WARNING, key,
            message, SUGGEST_WORKERS,
            per_step=slope * seconds / steps if steps > 0 else 0.0, per_minute=slope * 60,
        )  # fmt: skip
        self._emit(trend, alert)

    def _per_minute(self, trend: _Trend, slope: float) -> float:
        dt = trend.times[-1] - trend.times[0]
        ds = trend.steps[-1] - trend.steps[0]
        return slope * ds / dt * 60 if dt > 0 else 0.0

    def _raise_leak(self, key: str, trend: _Trend, slope: float, sample: Sample) -> None:
        device, metric = split_key(key)
        culprits = self._culprits
        tensors_flat = self._tensors_flat()
        label = "process RSS" if metric == "rss" else f"{device} allocated"
        message = f"{label} grows {format_bytes(slope, signed=True)}/step"
        suggestion = suggestion_for(culprits)
        if culprits:
            message += ": " + "; ".join(describe_culprit(c) for c in culprits[:3])
        elif metric == "rss" and tensors_flat:
            suggestion = SUGGEST_NOT_TENSORS
            message += "; tensor bytes are flat (not tensors)"
        elif not culprits:
            message += "; looking for the tensors behind it…"
        previous = trend.alert
        if previous is not None:
            trend.updates += 1
            changed = (
                abs(previous.per_step - slope) > 0.2 * max(previous.per_step, 1)
                or len(previous.culprits) != len(culprits)
                or previous.message != message
            )
            if not changed and trend.updates % 20:
                return
        severity = Severity.CRITICAL if self._near_capacity(device, slope) else Severity.WARNING
        alert = trend.make_alert(
            sample, f"leak:{key}", AlertKind.LEAK, severity, key, message, suggestion,
            per_step=slope, per_minute=self._per_minute(trend, slope), culprits=tuple(culprits),
        )  # fmt: skip
        self._emit(trend, alert)

    def _near_capacity(self, device: str, slope: float) -> bool:
        total = self.capacity.get(device)
        used = self._latest.get(f"{device}/allocated") or self._latest.get(f"{device}/rss")
        if not total or used is None or slope <= 0:
            return False
        return (total - used) / slope < 1000  # out of memory within 1,000 steps

    def _tensors_flat(self) -> bool:
        if len(self._tensor_bytes) < 2:
            return False
        (s0, b0), (s1, b1) = self._tensor_bytes[0], self._tensor_bytes[-1]
        return s1 > s0 and (b1 - b0) / (s1 - s0) < self.settings.abs_per_step / 4

    def _evaluate_cache(
        self, key: str, trend: _Trend, growing: bool, slope: float, sample: Sample
    ) -> None:
        device = split_key(key)[0]
        allocated = self._trends.get(f"{device}/allocated")
        flat = (
            allocated is not None
            and len(allocated.values) >= 6
            and theil_sen(np.fromiter(allocated.steps, float), np.fromiter(allocated.values, float))
            < self.settings.abs_per_step / 4
        )
        if growing and flat:
            trend.quiet = 0
            if trend.alert is None:
                message = (
                    f"{device} reserved grows {format_bytes(slope, signed=True)}/step while "
                    "allocated is flat: allocator cache, not a leak"
                )
                alert = trend.make_alert(
                    sample, f"cache_growth:{device}", AlertKind.CACHE_GROWTH,
                    Severity.WARNING, key, message, SUGGEST_CACHE,
                    per_step=slope, per_minute=self._per_minute(trend, slope),
                )  # fmt: skip
                self._emit(trend, alert)
        elif trend.alert is not None:
            trend.quiet += 1
            if trend.quiet >= self.settings.resolve_after:
                self._resolve(trend, sample)

    def _resolve(self, trend: _Trend, sample: Sample, why: str = "stopped growing") -> None:
        alert = trend.alert
        if alert is None:
            return
        resolved = replace(
            alert,
            t=sample.t,
            state=AlertState.RESOLVED,
            step=sample.step or alert.step,
            message=f"{alert.message} ({why})",
        )
        trend.alert = None
        self._active.pop(alert.key, None)
        self._submit(resolved)

    def _emit(self, trend: _Trend, alert: Alert) -> None:
        trend.alert = alert
        self._active[alert.key] = alert
        self._submit(alert)

    def _submit(self, alert: Alert) -> None:
        self.submit(alert)  # the Session drops alerts the user muted

    # -- censuses ------------------------------------------------------------------------
    def _on_census(self, event: CensusTaken) -> None:
        self._tables.append((event.step, group_census(event.census)))
        self._culprits = find_culprits(list(self._tables))
        self._tensor_bytes.append((event.step, event.census.total_bytes()))
        self._last_census_step = event.step
        if self._suspected:
            self._culprit_censuses += 1
        # Re-word active leak alerts now that culprits may be known.
        for key, trend in self._trends.items():
            if (
                trend.alert is not None
                and trend.alert.kind is AlertKind.LEAK
                and len(self._tables) >= 2
            ):
                last = Sample(event.t, {}, event.step)
                self._raise_leak(key, trend, trend.alert.per_step, last)

    # -- epochs and capacity -----------------------------------------------------------------
    def _on_epoch(self, event: Marker) -> None:
        s = self.settings
        for key, value in self._latest.items():
            if not key.endswith(("/allocated", "/rss")):
                continue
            starts = self._epoch_starts.setdefault(key, [])
            starts.append(_net(key, value, self._latest)[0])
            if len(starts) < 4:
                continue
            last = starts[-4:]
            rises = [b - a for a, b in itertools.pairwise(last)]
            floor = max(s.abs_per_step, 0.01 * last[0])
            alert_key = f"epoch_growth:{key}"
            if all(r >= floor for r in rises):
                per_epoch = sum(rises) / len(rises)
                alert = Alert(
                    event.t,
                    alert_key,
                    AlertKind.EPOCH_GROWTH,
                    Severity.WARNING,
                    AlertState.ACTIVE,
                    key,
                    event.step,
                    event.step,
                    f"{key} at the start of each epoch rose for 3 epochs in a row "
                    f"({format_bytes(per_epoch, signed=True)}/epoch)",
                    "Something carries over from one epoch to the next: a growing list, "
                    "a cache, or tensors kept with their graph (see the Tensors panel).",
                    raised_step=event.step,
                )
                if alert_key not in self._active:
                    self._active[alert_key] = alert
                    self._submit(alert)
            elif alert_key in self._active:
                old = self._active.pop(alert_key)
                self._submit(replace(old, t=event.t, state=AlertState.RESOLVED, step=event.step))

    def _check_capacity(self, sample: Sample) -> None:
        s = self.settings
        for key, value in sample.values.items():
            device, metric = split_key(key)
            share = None
            if metric == "reserved" and device in self.capacity:
                share = value / self.capacity[device]
                total = format_bytes(self.capacity[device])
                what = f"{device} reserved {format_bytes(value)} of {total}"
            elif metric == "available" and "cpu" in self.capacity:
                share = 1 - value / self.capacity["cpu"]
                what = f"system RAM {100 * share:.0f}% in use ({format_bytes(value)} available)"
            elif metric == "alloc_retries" and value > self._latest.get(f"{key}#seen", 0):
                self._latest[f"{key}#seen"] = value
                if value > 0:
                    self._capacity_alert(
                        f"alloc_retries:{device}",
                        AlertKind.ALLOC_RETRIES,
                        Severity.CRITICAL,
                        key,
                        sample,
                        f"{device}: {value:.0f} allocation retries "
                        "(cudaMalloc failed, cache flushed)",
                        SUGGEST_RETRIES,
                    )
                continue
            if share is None:
                continue
            alert_key = f"capacity:{device if metric != 'available' else 'cpu'}"
            if share >= s.capacity_warning:
                severity = Severity.CRITICAL if share >= s.capacity_critical else Severity.WARNING
                self._capacity_alert(
                    alert_key,
                    AlertKind.CAPACITY,
                    severity,
                    key,
                    sample,
                    f"{what} ({100 * share:.0f}%)",
                    SUGGEST_CAPACITY,
                )
            elif alert_key in self._active and share < s.capacity_warning - 0.05:
                old = self._active.pop(alert_key)
                self._submit(replace(old, t=sample.t, state=AlertState.RESOLVED))

    def _capacity_alert(
        self,
        key: str,
        kind: AlertKind,
        severity: Severity,
        series: str,
        sample: Sample,
        message: str,
        suggestion: str,
    ) -> None:
        old = self._active.get(key)
        if old is not None and old.severity == severity:
            return
        alert = Alert(
            sample.t,
            key,
            kind,
            severity,
            AlertState.ACTIVE,
            series,
            old.first_step if old else self._last_step,
            self._last_step,
            message,
            suggestion,
            raised_step=old.raised_step if old else self._last_step,
        )
        self._active[key] = alert
        self._submit(alert)
