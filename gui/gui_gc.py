"""Python's cyclic garbage collection, kept on the GUI thread while a window is open.

CPython's collector runs in whichever thread crosses an allocation threshold: in the
window that is often the script's thread, or the command thread. A collection there can
destroy Qt objects caught in reference cycles (pyqtgraph items, dialogs, timers) from the
wrong thread, and PySide6 deadlocks or crashes doing that. The known cure (calibre,
napari#1029, pyqtgraph's ``GarbageCollector``) is to turn automatic collection off and run
the same collections from a timer of the GUI thread. pyqtgraph's class cannot be stopped
or undone, and it would run a full collection every tenth young one on any heap size; this
one restores the interpreter's state when the last window closes, and keeps full
collections as rare as CPython's own heuristic does (below).

The script's garbage is still collected, by the same generational thresholds, at most one
tick (50 ms) later than the interpreter would have. A script that disables collection with
``gc.set_threshold(0)`` is honoured; one that calls ``gc.collect()`` itself still collects
in its own thread (Qt garbage then lives at most one tick, so there is rarely any).
"""

from __future__ import annotations

import gc
import time

from PySide6.QtCore import QObject, QTimer, Slot

#: How often the GUI thread checks the collector's counters (ms).
TICK_MS = 50


class GuiThreadCollector(QObject):
    """Runs the generational collections of this process from the GUI thread's timer.

    Several windows may hold it (one process, one collector): automatic collection stays
    off until the last :meth:`release`, then returns to what it was before the first
    :meth:`acquire`.
    """

    _holders = 0
    _was_enabled = False
    _instance: GuiThreadCollector | None = None

    def __init__(self) -> None:
        super().__init__()
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self.collect_due)
        self._last_full = time.perf_counter()
        self._full_cost = 0.0
        self.collections = [0, 0, 0]  # by generation, for tests and the curious

    # -- holders -------------------------------------------------------------------------
    @classmethod
    def acquire(cls) -> GuiThreadCollector:
        """Take over automatic collection (call in the GUI thread); return the collector."""
        if cls._instance is None:
            cls._instance = GuiThreadCollector()
        if cls._holders == 0:
            cls._was_enabled = gc.isenabled()
            gc.disable()
            cls._instance._timer.start()
        cls._holders += 1
        return cls._instance

    @classmethod
    def release(cls) -> None:
        """Give automatic collection back once no window holds it any more."""
        if cls._holders == 0:
            return
        cls._holders -= 1
        if cls._holders == 0 and cls._instance is not None:
            cls._instance._timer.stop()
            # Garbage made since the last tick goes now, here, before threads collect again.
            gc.collect()
            if cls._was_enabled:
                gc.enable()

    @classmethod
    def active(cls) -> bool:
        """True while a window holds the collector."""
        return cls._holders > 0

    # -- the tick ------------------------------------------------------------------------
    @Slot()
    def collect_due(self) -> None:
        """Collect the oldest generation whose counter passed its threshold, as CPython does."""
        if gc.isenabled():
            gc.disable()  # a script's gc.enable() would put collection back in its thread
        thresholds = gc.get_threshold()
        if thresholds[0] == 0:  # gc.set_threshold(0): the script wants no collections
            return
        counts = gc.get_count()
        if counts[0] <= thresholds[0]:
            return
        generation = 0
        if counts[1] > thresholds[1]:
            generation = 1
            if counts[2] > thresholds[2] and self._full_is_due():
                generation = 2
        started = time.perf_counter()
        gc.collect(generation)
        if generation == 2:
            self._last_full = time.perf_counter()
            self._full_cost = self._last_full - started
        self.collections[generation] += 1

    def _full_is_due(self) -> bool:
        """Full collections at most 1 time in 20 of their own cost.

        CPython skips a due full collection until a quarter of the long-lived objects are
        new since the last one, so a big heap (a training script's) is not walked over and
        over; its counters are not visible from Python, and a bound on the time spent in
        full collections keeps the same promise.
        """
        return time.perf_counter() - self._last_full >= 20 * self._full_cost
