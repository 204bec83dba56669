"""What a viewer that attaches late is sent: the run so far, bounded.

The agent keeps the last periodic samples and, apart from them, the last step markers
and step-boundary readings (a fast loop of 100 steps/s would otherwise push the periodic
samples out in a minute); the rest (the run's start, markers, logs, alerts, censuses)
the Session already holds.
"""

from __future__ import annotations

import heapq
from collections import deque

from torchmem.events import AlertState, Event, Marker, MarkerKind, Sample
from torchmem.session import Session

#: Periodic samples kept for a viewer that attaches late (10 min at 10 Hz).
HISTORY = 6000
#: Step markers and step-boundary readings kept for it (the last 6,000 steps): kept apart,
#: so that a fast loop (100 steps/s) does not push the periodic samples out in a minute.
STEP_HISTORY = 12_000


class History:
    """The samples and steps a late viewer is replayed (:data:`HISTORY`,
    :data:`STEP_HISTORY`)."""

    def __init__(self) -> None:
        self.periodic: deque[Event] = deque(maxlen=HISTORY)
        self.steps: deque[Event] = deque(maxlen=STEP_HISTORY)

    def keep(self, event: Event) -> None:
        """Keep ``event`` if a late viewer needs it (cheap: the training loop calls it)."""
        if isinstance(event, Sample):
            (self.periodic if event.step is None else self.steps).append(event)
        elif isinstance(event, Marker) and event.kind is MarkerKind.STEP:
            self.steps.append(event)

    def replay(self, s: Session) -> list[Event]:
        """What a late viewer needs to see the run so far, in time order: the kept
        samples and steps, and from Session ``s`` the run's start and end, the user's
        markers, the last log lines, the active alerts and the last two censuses."""
        events: list[Event] = []
        if s.run_started is not None:
            events.append(s.run_started)
        events.extend(heapq.merge(list(self.periodic), list(self.steps), key=_time_of))
        events.extend(s.user_markers())
        events.extend(list(s.logs)[-1000:])
        events.extend(a for a in s.alert_log if a.state is AlertState.ACTIVE)
        latest, previous = s.censuses()
        events.extend(c for c in (previous, latest) if c is not None)
        if s.run_finished is not None:
            events.append(s.run_finished)
        events.sort(key=lambda e: e.t)
        return events


def _time_of(event: Sample | Marker) -> float:
    return event.t
