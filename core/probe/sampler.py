"""The sampler: reads every backend at a steady rate in a daemon thread.

It reads counters only (see backends), so it can run inside a training process. The
loop is drift-free: tick k is due at ``start + k * period``; a late tick is taken at once
and missed ticks are skipped rather than bunched up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from torchmem.events import Sample
from torchmem.probe.backends import MemoryBackend

log = logging.getLogger(__name__)

MIN_HZ, MAX_HZ = 1.0, 100.0


def read_backends(backends: Sequence[MemoryBackend], full: bool = True) -> dict[str, float]:
    """One reading of ``backends``; a failing backend is logged and skipped, so that one
    broken counter never stops the others."""
    values: dict[str, float] = {}
    for backend in backends:
        try:
            backend.read(values, full)
        except Exception:
            log.debug("backend %s failed", backend.kind, exc_info=True)
    return values


def clamp_rate(hz: float) -> float:
    """Clamp a sampling rate to the supported 1..100 Hz."""
    return min(MAX_HZ, max(MIN_HZ, float(hz)))


class Sampler:
    """Polls ``backends`` at ``hz`` and hands each :class:`Sample` to ``sink``."""

    def __init__(
        self,
        backends: Sequence[MemoryBackend],
        sink: Callable[[Sample], None],
        hz: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backends = list(backends)
        self.sink = sink
        self.clock = clock
        self._period = 1.0 / clamp_rate(hz)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0
        self.skipped = 0
        # Boundary readings waiting for the sampler thread (bounded: drop the oldest).
        self._boundaries: deque[Sample] = deque(maxlen=10_000)

    @property
    def hz(self) -> float:
        """Current sampling rate."""
        return 1.0 / self._period

    def set_rate(self, hz: float) -> None:
        """Change the rate; takes effect from the next tick."""
        self._period = 1.0 / clamp_rate(hz)

    def read(self, full: bool = True) -> dict[str, float]:
        """One reading of every backend (see :func:`read_backends`)."""
        return read_backends(self.backends, full)

    def sample(self) -> Sample:
        """Take one sample now and hand it to the sink (boundary readings first)."""
        self.flush_boundaries()
        sample = Sample(self.clock(), self.read())
        self.sink(sample)
        return sample

    def record_boundary(self, step: int) -> None:
        """Read the cheap counters at the boundary of ``step``, inside the training loop.

        Only the reading happens here; the reading is handed to the sink by the sampler's
        own thread at its next tick, so that whatever the Session and its models do with
        it (leak detection, drawing) never runs in the training loop.
        """
        self._boundaries.append(Sample(self.clock(), self.read(full=False), step))

    def flush_boundaries(self) -> None:
        """Hand pending boundary readings to the sink, oldest first."""
        while self._boundaries:
            try:
                self.sink(self._boundaries.popleft())
            except IndexError:  # drained by another thread meanwhile
                return

    def start(self) -> None:
        """Start the sampling thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="torchmem-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread and wait for it (cooperative: it checks between ticks)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        """True while the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        start = time.monotonic()
        period = self._period
        k = 0
        while not self._stop.is_set():
            self.sample()
            self.ticks += 1
            if self._period != period:  # rate changed: restart the schedule from now
                period, start, k = self._period, time.monotonic(), 0
            k += 1
            due = start + k * period
            now = time.monotonic()
            if now > due:
                missed = int((now - due) / period) + 1
                self.skipped += missed - 1 if missed > 1 else 0
                k += missed - 1
                due = start + k * period
            self._stop.wait(max(0.0, due - now))
