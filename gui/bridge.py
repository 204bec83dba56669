"""From the Session (any thread) to the views (GUI thread), at most ~30 times a second.

Sources submit events on their own threads. The bridge never touches a widget from
there: its Session listener only queues discrete events under a lock. A GUI-thread timer
drains that queue and, when the Session's revision moved, tells views to redraw. This
throttles redraws by construction, however fast samples or log lines arrive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from torchmem.events import Event, Sample
from torchmem.session import Session

REDRAW_HZ = 30


class SessionBridge(QObject):
    """Turns Session activity into throttled Qt signals on the GUI thread."""

    #: The Session changed since the last tick (redraw traces and readings).
    changed = Signal()
    #: Discrete events (logs, markers, run state, command results), oldest first.
    events = Signal(list)

    def __init__(self, session: Session, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self._lock = threading.Lock()
        self._pending: list[Event] = []
        self._seen_revision = -1
        self.redraws = 0
        self._watchers: list[tuple[tuple[type, ...], Callable[[], None]]] = []
        self._unsubscribe = session.subscribe(self._on_event)
        self._timer = QTimer(self)
        self._timer.setInterval(int(1000 / REDRAW_HZ))
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def _on_event(self, event: Event) -> None:
        # Called on the source's thread: queue only, never touch Qt objects here.
        if not isinstance(event, Sample):
            with self._lock:
                self._pending.append(event)

    def when(self, kinds: tuple[type, ...], slot: Callable[[], None]) -> None:
        """Call ``slot()`` (on the GUI thread) after each batch of events that holds one of
        ``kinds``: how a view that redraws on, say, a new census subscribes itself."""
        self._watchers.append((kinds, slot))

    @Slot()
    def _tick(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            self.events.emit(pending)
            for kinds, slot in self._watchers:
                if any(isinstance(event, kinds) for event in pending):
                    slot()
        if self.session.revision != self._seen_revision:
            self._seen_revision = self.session.revision
            self.redraws += 1
            self.changed.emit()

    def flush(self) -> None:
        """Deliver everything queued now (used before closing and by tests)."""
        self._tick()

    def close(self) -> None:
        """Stop listening and stop the timer."""
        self._timer.stop()
        self._unsubscribe()
