"""Run summaries (``--summary out.json``): one builder and one schema for every kind.

``torchmem run`` (a script), ``torchmem run -- COMMAND`` (a job) and ``torchmem attach``
write the same core keys, built here from the Session they recorded, and described by
``resources/summary.schema.json`` (every summary is validated against it in the tests).
Files are written atomically, so that a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

from torchmem import __version__
from torchmem.session import Session

#: Bumped when a key changes meaning or goes; new keys do not bump it.
SCHEMA_VERSION = 1

Kind = Literal["run", "job", "attach", "tune"]


def int_peaks(peaks: dict[str, float]) -> dict[str, int]:
    """Peak bytes per series as a summary writes them (whole bytes)."""
    return {k: int(v) for k, v in peaks.items()}


def rank_row(remote: Any) -> dict[str, Any]:
    """One process of a job or an attach (a :class:`~torchmem.sources.remote.RemoteSource`):
    ``status`` is ``finished`` (its run reported its end), ``ended`` (it went away
    without saying how) or ``running`` (still running when the summary was written);
    ``ended`` is True for the first two."""
    if remote.run_finished_seen:
        status = "finished"
    elif remote.end_reason not in ("", "closed"):
        status = "ended"
    else:
        status = "running"
    entry = remote.entry
    return {
        "pid": remote.pid,
        "rank": entry.rank,
        "world_size": entry.world_size,
        "status": status,
        "ended": status != "running",
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
        )
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
