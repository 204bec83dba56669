"""Several recorded runs side by side: one row of figures each, traces on one axis.

Before and after a fix, two batch sizes, two allocator settings: the question is always
"what changed", so the rows hold the same figures for every run (peaks per device, step
time, steps, alerts, the allocator settings it ran with), and :func:`aligned` puts one
trace of each run on a shared axis: seconds since the run started, or training steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from torchmem.record.replay import Recording
from torchmem.series import device_order

Axis = Literal["time", "steps"]


@dataclass
class CompareRow:
    """The figures of one run that a comparison puts side by side."""

    name: str
    created: str
    status: str
    duration_s: float
    steps: int
    step_time_s: float | None
    peaks: dict[str, float]
    alerts: int
    allocator: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        """The row as ``torchmem compare --json`` prints it."""
        return {
            "name": self.name, "created": self.created, "status": self.status,
            "duration_s": round(self.duration_s, 3), "steps": self.steps,
            "step_time_s": self.step_time_s,
            "peak_bytes": {k: int(v) for k, v in self.peaks.items()},
            "alerts": self.alerts, "allocator": self.allocator,
        }  # fmt: skip


def run_name(recording: Recording) -> str:
    """The user's title of the run, else its script's file name."""
    meta = recording.meta
    if meta.get("title"):
        return str(meta["title"])
    started = recording.session.run_started
    script = meta.get("script") or (started.script if started else None)
    return Path(str(script)).name if script else recording.path.stem


def run_labels(recordings: list[Recording]) -> list[str]:
    """A name per run that tells them apart: runs of the same script also show the
    arguments that differ between them (``demo_train.py --batch-size 32``)."""
    names = [run_name(r) for r in recordings]
    argvs = []
    for r in recordings:
        started = r.session.run_started
        argvs.append(list(started.argv) if started else list(r.meta.get("argv") or []))
    labels = []
    for i, name in enumerate(names):
        twins = [j for j, other in enumerate(names) if other == name]
        if len(twins) == 1:
            labels.append(name)
            continue
        shared = set.intersection(*(set(argvs[j]) for j in twins))
        own = [
            a
            for k, a in enumerate(argvs[i])
            if a not in shared or _is_option_of(argvs[i], k, shared)
        ]
        extra = " ".join(own)[:60] or recordings[i].meta.get("created", "")[:19].replace("T", " ")
        labels.append(f"{name} {extra}".strip())
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):  # still alike (same arguments, same second): number
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label} #{seen[label]}"
    return labels


def _is_option_of(argv: list[str], k: int, shared: set[str]) -> bool:
    """True when ``argv[k]`` is an option whose value differs (keep the option's name)."""
    return argv[k].startswith("-") and k + 1 < len(argv) and argv[k + 1] not in shared


def compare_row(recording: Recording, summary: dict[str, Any], name: str = "") -> CompareRow:
    """One run's row, from its recording and the summary rebuilt from it."""
    allocator = recording.meta.get("allocator")
    return CompareRow(
        name=name or run_name(recording),
        created=str(recording.meta.get("created", ""))[:19].replace("T", " "),
        status=str(summary["status"]),
        duration_s=float(summary["duration_s"]),
        steps=int(summary["steps"]),
        step_time_s=summary.get("step_time_s"),
        peaks=dict(summary["peak_bytes"]),
        alerts=len(summary["alerts"]),
        allocator=dict(allocator) if isinstance(allocator, dict) else {},
    )


def peak_keys(rows: list[CompareRow]) -> list[str]:
    """The peaks any of ``rows`` has, one column each: a job's ranks in order (rank 2
    before rank 10), its total last."""
    return sorted({key for row in rows for key in row.peaks}, key=device_order)


def common_keys(recordings: list[Recording]) -> list[str]:
    """Series every run has, in the first run's order (what can be overlaid)."""
    if not recordings:
        return []
    shared = set(recordings[0].session.keys())
    for recording in recordings[1:]:
        shared &= set(recording.session.keys())
    first = recordings[0].session.keys()
    return [k for k in first if k in shared]


def aligned(recording: Recording, key: str, axis: Axis) -> tuple[np.ndarray, np.ndarray]:
    """One trace of a run against seconds since its start, or against its steps."""
    session = recording.session
    keys = session.keys()
    if key not in keys:
        return np.empty(0), np.empty(0)
    t, v = session.arrays(key)
    started = session.run_started
    if axis == "steps":
        return session.to_steps(t), v
    return t - (started.t if started else 0.0), v
