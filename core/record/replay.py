"""Reading a session file back into a Session, the one model every view reads.

Reopening a run is replaying its events, in their order, into a fresh Session: traces,
markers, alerts and censuses then come out of the same code that showed them live, so a
reopened run shows the figures it showed then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from torchmem.events import RunFinished, Sample
from torchmem.record.overview import OVERVIEW_ABOVE, read_overview, seed_session
from torchmem.record.store import RecordError, SessionFile
from torchmem.session import Session

__all__ = ["RecordError", "Recording", "load"]

#: What a long run's reopening reads of its events, by kind (0: all): the start and end,
#: user marks, the devices' sizes, a job's members (the samples after the overview add up
#: to its totals), the newest log lines and alerts, and the last censuses (decoding one of
#: 2,000 storages takes ~0.1 s: the Tensors panel shows the last two). The rest stays in
#: the file, for `torchmem report --censuses` and the census diff.
TAIL = {
    "RunStarted": 0, "RunFinished": 0, "Marker": 0, "LogRecord": 2_000, "Alert": 1_000,
    "CommandResult": 200, "CensusTaken": 3, "CapacityKnown": 0, "JobMembers": 0,
}  # fmt: skip


@dataclass
class Recording:
    """A session file read back: its Session, its facts, and what could not be read."""

    path: Path
    session: Session
    meta: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    last_t: float = 0.0

    @property
    def complete(self) -> bool:
        """True when the recorder closed the file at the run's end (not killed)."""
        return bool(self.meta.get("complete"))

    @property
    def ended(self) -> RunFinished | None:
        """How the run ended, if the recording saw it."""
        return self.session.run_finished

    def wall_time(self, t: float) -> datetime | None:
        """The local date and time of session time ``t`` (None for an old file)."""
        t0 = self.meta.get("wall_t0")
        if not isinstance(t0, (int, float)):
            return None
        return datetime.fromtimestamp(t0 + t).astimezone()


def load(path: str | Path, session: Session | None = None) -> Recording:
    """Read a whole session file into ``session`` (a new one by default), event by event
    as its sources submitted them; RecordError if it cannot be read."""
    with SessionFile(path) as file:
        meta = file.meta()
        session = session if session is not None else Session()
        problems: list[str] = []
        last_t = 0.0
        samples, _ = file.span()
        overview = read_overview(file.conn) if samples > OVERVIEW_ABOVE else None
        if overview is not None:
            # A long run: its overview, then the events a Session keeps of it.
            last_t = seed_session(session, overview)
            for event in file.event_tail(TAIL, problems):
                session.submit(event)
            # What came after the overview was last written (a run killed mid-way).
            for event in file.after(int(overview["counts"].get("seq", 0)), problems):
                session.submit(event)
                if isinstance(event, Sample):
                    last_t = max(last_t, event.t)
        else:
            for event in file.events(problems):
                session.submit(event)
                if isinstance(event, Sample):
                    last_t = max(last_t, event.t)
    recording = Recording(Path(path), session, meta, problems, last_t)
    if not meta.get("complete") and session.samples == 0 and not problems:
        problems.append("it holds no sample: the run was stopped before its first reading")
    return recording
