"""Read a snapshot's trace straight into columns, with the native scanner (``_scan.c``).

``pickle.load`` of a 1 GiB snapshot builds some 25 million objects only for the indexer
to fold them into numpy columns; the scanner reads the mapped file once and keeps the
columns, the interned frames and stacks, and the small rest (segments, settings) as
Python objects. When the extension was not built (no compiler at install time) or the
file is a kind of pickle it leaves to pickle (objects, old text protocols), callers fall
back to :func:`~torchmem.snapshots.read.read_snapshot`, which says what the file is.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from torchmem.snapshots.read import SnapshotError, check_snapshot

try:
    from torchmem.snapshots import _scan
except ImportError:  # built without a compiler: the pickle path does the work
    _scan = None


def available() -> bool:
    """Whether the native scanner was built."""
    return _scan is not None


class _EventList(int):
    """Where a trace list stood in the snapshot: the scanner's id of that list."""


@dataclass
class ScannedSnapshot:
    """A snapshot read by the scanner: its plain data without the events, the events as
    columns (device, time µs, action code, address, size, stack id) in trace order per
    device, and the interned frames ``(name, filename, line)`` and stacks (frame ids)."""

    data: dict[str, Any]
    events: list[np.ndarray]
    frames: list[tuple[str, str, int]]
    stacks: list[tuple[int, ...]]


def scan_snapshot(
    path: str | os.PathLike[str],
    actions: tuple[str, ...],
    progress: Callable[[float], None] | None = None,
) -> ScannedSnapshot | None:
    """The snapshot at ``path`` read by the scanner (``actions`` names the action codes);
    None where the pickle reader must take it (no scanner, an unreadable or empty file, a
    pickle that is not plain data), SnapshotError for a truncated or damaged one."""
    if _scan is None:
        return None
    try:
        with Path(path).open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:1] != b"\x80":
                return None
            out = _scan.scan(m, actions, _EventList, progress)
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, OSError) or (isinstance(exc, ValueError) and "mmap" in str(exc)):
            return None  # missing, unreadable, empty: read_snapshot says which
        # TypeError: a damaged key (a list where a string was) cannot key a dict.
        raise SnapshotError(
            f"{path} is truncated or damaged ({exc}); a snapshot cut short while it was "
            "written cannot be read"
        ) from None
    except NotImplementedError:
        return None
    data = check_snapshot(out["tree"], str(path))
    return ScannedSnapshot(data, _trace_order(data, out), out["frames"], out["stacks"])


def _trace_order(data: dict[str, Any], out: dict[str, Any]) -> list[np.ndarray]:
    """The scanner's rows as the index's event columns: each trace list's rows become its
    device's (by the list's place in ``device_traces``), devices in order, and a row with
    no time gets its place in its trace, as the pickle reader gives it."""
    lists = np.frombuffer(out["list"], dtype=np.int32)
    # A device's rows are its list's, in append order; one list on two devices (pickle
    # writes the second as a reference) gives both its rows.
    per_device = [
        (d, np.flatnonzero(lists == int(t)))
        for d, t in enumerate(data["device_traces"])
        if type(t) is _EventList
    ]
    data["device_traces"] = [[] for _ in data["device_traces"]]  # the rows hold them
    rows = np.concatenate([r for _, r in per_device] or [np.empty(0, np.int64)])
    device = np.concatenate(
        [np.full(len(r), d, dtype=np.int16) for d, r in per_device] or [np.empty(0, np.int16)]
    )
    if len(per_device) == 1 and len(rows) == len(lists):
        rows = slice(None)  # one trace holds every row, in order: no copy of ten million
    time = np.frombuffer(out["time"], dtype=np.int64)[rows]
    untimed = time == np.iinfo(np.int64).min
    if untimed.any():  # torch 2.0's traces
        time = time.copy()  # writable (the file's column is not)
        starts = np.searchsorted(device, device)  # each row's device's first row
        time[untimed] = (np.arange(len(device)) - starts)[untimed]
    return [
        device,
        time,
        np.frombuffer(out["action"], dtype=np.int8)[rows],
        np.frombuffer(out["addr"], dtype=np.uint64)[rows],
        np.frombuffer(out["size"], dtype=np.int64)[rows],
        np.frombuffer(out["stack"], dtype=np.int32)[rows],
    ]
