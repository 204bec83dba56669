"""A long recording's overview: what reopening reads instead of every sample.

A week at 10 Hz is six million samples; replaying them takes minutes, yet the window
draws each series as min/max buckets plus its last few thousand readings anyway (see
:class:`~torchmem.timeseries.SeriesBuffer`). The recorder therefore keeps exactly that
per series, and the step boundaries as the step clock keeps them, while it writes, and
stores them in the file's ``overview`` table every :data:`EVERY_S` seconds and at the end.
A long file then reopens from its overview in a fraction of a second, with every peak
(buckets keep the maximum), and with the events a Session keeps (the newest log lines,
alerts and censuses, every marker and the run's start and end).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import msgpack
import numpy as np

from torchmem.events import JobMembers, Sample
from torchmem.job_totals import JobTotals
from torchmem.session import Session
from torchmem.timeseries import SeriesBuffer, StepClock, append_readings

#: How often the recorder rewrites the overview (s); a file cut short by kill -9 reopens
#: from an overview at most this old, then the samples written after it.
EVERY_S = 30.0
#: Files with more samples than this (about half an hour at 10 Hz) reopen from their
#: overview, when they have one: replaying every event through the window's Session costs
#: about 0.1 ms each (an hour took 3.4 s), the overview a bounded fraction of a second.
OVERVIEW_ABOVE = 20_000


class OverviewBuilder:
    """The series and step clock of a run as a Session would hold them, kept by the
    recorder thread (bounded memory: a few hundred KiB per series)."""

    def __init__(self) -> None:
        self.series: dict[str, SeriesBuffer] = {}
        self.steps = StepClock()
        self.samples = 0
        self._job = JobTotals()  # a job's totals, derived as the Session derives them
        #: The file's sequence number the overview covers (rows after it are newer).
        self.seq = 0
        self.last_written = time.monotonic()

    def add_sample(self, sample: Sample) -> None:
        """Fold one sample in."""
        self.samples += 1
        for values in (sample.series(), self._job.fold(sample)):
            append_readings(self.series, sample.t, values)

    def add_members(self, members: JobMembers) -> None:
        """A job's members changed: its totals are summed over them from now on."""
        self._job.on_members(members)

    def add_step(self, t: float, step: int) -> None:
        """Every step boundary, before the file thins them."""
        self.steps.add(t, step)

    def due(self) -> bool:
        """True when the overview in the file is older than :data:`EVERY_S`."""
        return time.monotonic() - self.last_written >= EVERY_S

    def write(self, conn: sqlite3.Connection) -> None:
        """Store the overview (inside the caller's transaction)."""
        rows = [
            (f"series:{key}", msgpack.packb(_pack_series(buf))) for key, buf in self.series.items()
        ]
        t, s = self.steps.boundaries()
        rows.append(("steps", msgpack.packb({"t": t.tobytes(), "s": s.tobytes(),
                                             "steps": self.steps.steps})))  # fmt: skip
        rows.append(("counts", msgpack.packb({"samples": self.samples, "seq": self.seq})))
        conn.executemany("INSERT OR REPLACE INTO overview (key, data) VALUES (?, ?)", rows)
        self.last_written = time.monotonic()


def _pack_series(buf: SeriesBuffer) -> dict[str, Any]:
    t, v = buf.arrays()
    return {"t": t.tobytes(), "v": v.tobytes(), "peak": float(buf.peak), "count": buf.count}


def read_overview(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """The overview of a file, or None (an older file, or one cut before the first)."""
    try:
        rows = conn.execute("SELECT key, data FROM overview").fetchall()
    except sqlite3.DatabaseError:
        return None
    if not rows:
        return None
    out: dict[str, Any] = {"series": {}}
    try:
        for key, data in rows:
            value = msgpack.unpackb(data)
            if key.startswith("series:"):
                out["series"][key.removeprefix("series:")] = value
            else:
                out[key] = value
    except (ValueError, msgpack.UnpackException):
        return None
    return out if "counts" in out and "steps" in out else None


def seed_session(session: Session, overview: dict[str, Any]) -> float:
    """Fill ``session``'s series and step clock from an overview; returns the time of the
    newest reading."""
    series: dict[str, SeriesBuffer] = {}
    last_t = 0.0
    for key, data in overview["series"].items():
        t = np.frombuffer(data["t"], dtype=np.float64)
        v = np.frombuffer(data["v"], dtype=np.float64)
        # min/max pairs then recent readings, in time order: as samples, they rebuild the
        # same envelope and recent window (bucket sizes aside), and the same peak.
        buf = SeriesBuffer()
        buf.extend(t, v)
        buf.peak = max(buf.peak, float(data["peak"]))
        series[key] = buf
        if len(t):
            last_t = max(last_t, float(t[-1]))
    steps = overview["steps"]
    clock = StepClock()
    for ti, si in zip(
        np.frombuffer(steps["t"], dtype=np.float64).tolist(),
        np.frombuffer(steps["s"], dtype=np.float64).tolist(),
        strict=True,
    ):
        clock.add(ti, int(si))
    clock.steps = max(clock.steps, int(steps["steps"]))
    session.load_history(series, clock, int(overview["counts"]["samples"]))
    return last_t
