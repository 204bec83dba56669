"""Run summaries (``--summary out.json``): one builder and one schema for every kind.

``torchmem run`` (a script), ``torchmem run -- COMMAND`` (a job) and ``torchmem attach``
write the same core keys, built here from the Session they recorded, and described by
``resources/summary.schema.json`` (every summary is validated against it in the tests).
Files are written atomically, so that a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np

from torchmem import __version__
from torchmem.session import Session
from torchmem.sources.vanished import oom_killer_hint
from torchmem.timeseries import StepClock

#: Bumped when a key changes meaning or goes; new keys do not bump it.
SCHEMA_VERSION = 1

Kind = Literal["run", "job", "attach", "tune"]


def int_peaks(peaks: dict[str, float]) -> dict[str, int]:
    """Peak bytes per series as a summary writes them (whole bytes)."""
    return {k: int(v) for k, v in peaks.items()}


def rank_row(remote: Any, session: Session) -> dict[str, Any]:
    """One process of a job or an attach (a :class:`~torchmem.sources.remote.RemoteSource`
    submitting to ``session``): ``status`` is ``finished`` (its run reported its end),
    ``ended`` (it went away without saying how) or ``running`` (still running when the
    summary was written); ``ended`` is True for the first two. Its own peaks are fields
    of its row, named within the process (``cuda:1``), for a reader that wants the
    fullest rank."""
    if remote.run_finished_seen:
        status = "finished"
    elif remote.end_reason not in ("", "closed"):
        status = "ended"
    else:
        status = "running"
    entry = remote.entry
    finished = remote.finished
    return {
        "pid": remote.pid,
        "rank": entry.rank,
        "world_size": entry.world_size,
        "status": status,
        "ended": status != "running",
        "host": entry.host or None,
        "run_status": finished.status.value if finished is not None else None,
        "exit_code": finished.exit_code if finished is not None else None,
        "message": finished.message if finished is not None else None,
        "steps": remote.steps.steps,
        "step_time_s": clock_step_time(remote.steps),
        "peak_bytes": int_peaks(session.peak_bytes(remote.scope)),
        "peak_reserved_bytes": session.peaks_of("reserved", remote.scope),
    }


def build_summary(kind: Kind, session: Session | None, **fields: Any) -> dict[str, Any]:
    """The keys every summary has, from ``session``, then the ``fields`` of its kind
    (``exit_code``, ``duration_s``, ``ranks``, ``script``, ``pid``, ...).

    A summary of several runs (a tuning search: one process per trial) has no one Session:
    it passes ``None`` and gives ``steps``, ``samples``, ``peak_bytes`` and ``alerts`` in
    ``fields``."""
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "torchmem_version": __version__,
    }
    if session is not None:
        data.update(
            steps=session.steps.steps,
            samples=session.samples,
            peak_bytes=int_peaks(session.peak_bytes()),
            alerts=[a.to_json() for a in session.alert_list()],
            capacity_bytes=session.capacity(),
        )
        retries = session.retry_streaks()
        if retries:  # read at step boundaries: a tuning trial
            data["alloc_retry_steps"] = retries
    data.update(fields)
    return data


def write_summary(path: str, data: dict[str, Any]) -> bool:
    """Write ``data`` as JSON to ``path`` atomically; on failure say why on stderr and
    return False (the caller picks the exit code)."""
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, out)
    except OSError as exc:
        sys.stderr.write(f"torchmem: cannot write the summary to {path}: {exc}\n")
        return False
    return True


def step_time(session: Session) -> float | None:
    """The median time of a step after the first (which warms caches and the allocator
    up), or None with fewer than two steps after it."""
    return clock_step_time(session.steps)


def clock_step_time(clock: StepClock) -> float | None:
    """:func:`step_time` of one step clock (a rank's own, in a job)."""
    times, steps = clock.boundaries()
    if len(times) <= 2:
        return None
    # Per step, not per boundary: the step clock (and a recording) may keep only some
    # boundaries of a long run, two steps apart or more.
    intervals = np.diff(times[1:]) / np.maximum(np.diff(steps[1:]), 1)
    return round(float(statistics.median(intervals)), 6)


def run_summary(
    session: Session, kind: Kind = "run", last_t: float | None = None, **fields: Any
) -> dict[str, Any]:
    """The summary of the run ``session`` holds, from its events alone (the window's runs
    and recorded sessions): how it started and ended, steps, step time, peaks.

    A run whose end the session never saw is ``killed or crashed``, lasting until
    ``last_t`` (its last reading)."""
    from torchmem.events import EXIT_UNKNOWN, RunStatus
    from torchmem.units import format_duration

    started, finished = session.run_started, session.run_finished
    if finished is not None:
        status, code, message = finished.status.value, finished.exit_code, finished.message
        duration, traceback = finished.duration_s, finished.traceback
    else:
        start_t = started.t if started else 0.0
        duration = max(0.0, (last_t if last_t is not None else session.now()) - start_t)
        status, code, traceback = RunStatus.KILLED.value, EXIT_UNKNOWN, ""
        message = (
            f"the recording ends {format_duration(duration)} into the run without its end: "
            "torchmem or the script was stopped from outside (kill -9, a crash, the OOM "
            "killer, a power cut)"
        ) + oom_killer_hint(session)
    base = {
        "script": started.script if started else None,
        "argv": list(started.argv) if started else [],
        "status": status,
        "message": message,
        "exit_code": code,
        "duration_s": round(duration, 3),
        "traceback": traceback,
        "step_time_s": step_time(session),
        "peak_reserved_bytes": session.peaks_of("reserved"),
    }
    return build_summary(kind, session, **{**base, **fields})
