"""A recorded run read back as data: its summary (the schema of ``--summary``), rebuilt
by replaying the session file into a Session, and every sample as CSV.

What only the end of the run knew (the runner's step count, the kernel's peak RSS) is
taken from the summary the recorder stored, when the run got that far. A recording that
stops without its end (``kill -9``, a crash, the OOM killer) is ``killed or crashed``,
with what was recorded until then.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from torchmem.events import CapacityKnown
from torchmem.leaks.oom import explain_oom
from torchmem.record.replay import Recording
from torchmem.record.store import SessionFile
from torchmem.report.summary import run_summary
from torchmem.units import format_duration

#: Keys only the end of a run knows; a report takes them from the stored summary (a run
#: stopped by --max-steps ended "finished", exit 0, though its runner said "stopped").
END_ONLY = (
    "steps", "capacity_bytes", "peak_rss_bytes", "max_steps", "pid", "ranks", "command",
    "injected", "attached", "snapshots", "status", "exit_code", "message",
)  # fmt: skip


def recorded_summary(recording: Recording) -> dict[str, Any]:
    """The run summary of a recorded session."""
    meta = recording.meta
    stored = meta.get("summary") if isinstance(meta.get("summary"), dict) else {}
    kind = meta.get("kind") if meta.get("kind") in ("run", "job", "attach") else "run"
    capacity = meta.get("capacity_bytes")
    if not recording.session.capacity() and isinstance(capacity, dict):
        # Recorded before capacity was an event: the file's facts held it.
        recording.session.submit(CapacityKnown(0.0, capacity))
    data = run_summary(recording.session, kind, last_t=recording.last_t)
    if data["script"] is None:
        data["script"], data["argv"] = meta.get("script"), list(meta.get("argv") or [])
    for key in END_ONLY:
        if key in stored:
            data[key] = stored[key]
    if meta.get("detached") and recording.ended is None:
        # torchmem let go of a process that went on: neither its end nor its exit code.
        for key in ("status", "exit_code", "traceback"):
            data.pop(key, None)
        data["message"] = (
            f"torchmem detached after {format_duration(recording.last_t)}; the process went on"
        )
    oom = explain_oom(recording.session)
    if oom is not None:
        data["oom"] = oom.to_json()
    snapshots = [c.output for c in recording.session.commands if c.command == "snapshot" and c.ok]
    if snapshots:
        data["snapshots"] = snapshots
    data["recording"] = {
        "path": str(recording.path),
        "complete": recording.complete,
        "created": str(meta.get("created", "")),
        "problems": list(recording.problems),
    }
    return data


def export_csv(path: Path, out: Path) -> int:
    """Write every sample of a session as CSV: time, wall-clock time, step, then one
    column per trace (bytes). Returns the number of rows."""
    with SessionFile(path) as file:
        keys = file.series_keys()
        t0 = file.meta().get("wall_t0")
        rows = 0
        tmp = out.with_name(out.name + ".tmp")
        with tmp.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["t_s", "unix_time", "step", *keys])
            for sample in file.samples():
                series = sample.series()
                wall = round(t0 + sample.t, 3) if isinstance(t0, (int, float)) else ""
                values = [
                    "" if (v := series.get(k)) is None else int(v) if v.is_integer() else v
                    for k in keys
                ]
                step = "" if sample.step is None else sample.step
                writer.writerow([round(sample.t, 4), wall, step, *values])
                rows += 1
        tmp.replace(out)
    return rows
