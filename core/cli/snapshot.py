"""``torchmem snapshot info [--json] FILE``: a memory snapshot's peak, what was live then
and who allocated it, without a browser.

The file is read and indexed once in a worker process (then reopened from the index);
every unreadable file is one line saying what it is, never a traceback.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from torchmem.snapshots import analysis
from torchmem.snapshots.index import SnapshotIndex
from torchmem.snapshots.open import SnapshotCancelled, open_snapshot
from torchmem.snapshots.read import SnapshotError
from torchmem.units import format_bytes


def snapshot_info(index: SnapshotIndex, top: int = 10) -> dict[str, Any]:
    """What ``--json`` prints: per device the peak, its time, the live set's owners and
    categories, and the segments at the end; the busiest device's figures at the top."""
    devices = []
    for device in index.devices:
        line = analysis.timeline(index, device)
        peak, when, event = line.peak
        live = analysis.live_at(index, device, event)
        seg = analysis.segments(index, device)
        devices.append({
            "device": device,
            "peak_active_bytes": peak,
            "peak_time_us": when,
            "events": int((index.ev_device == device).sum()),
            "live_at_peak": int(len(live)),
            "by_category": analysis.by_category(index, live),
            "top_stacks": [g.to_json() for g in analysis.by_owner(index, live, top)],
            "segments": seg.segments,
            "reserved_bytes": seg.reserved,
            "allocated_bytes": seg.allocated,
            "inactive_split_bytes": seg.inactive_split,
        })  # fmt: skip
    main = max(devices, key=lambda d: d["peak_active_bytes"], default=None)
    return {
        "file": index.meta.get("file"),
        "file_bytes": index.meta.get("file_bytes"),
        "events": index.meta.get("events", len(index.ev_time)),
        "segments": index.meta.get("segments", len(index.seg_total)),
        "peak_active_bytes": main["peak_active_bytes"] if main else 0,
        "peak_time_us": main["peak_time_us"] if main else 0,
        "peak_device": main["device"] if main else None,
        "top_stacks": main["top_stacks"] if main else [],
        "devices": devices,
        "allocator_settings": index.meta.get("allocator_settings", {}),
        # Allocations named from torchmem's censuses (0 for a snapshot it did not save).
        "named_allocations": len(index.tensor_names),
        "names_note": index.meta.get("names_note", ""),
    }


def info_headless(path: str, as_json: bool = False, top: int = 10, quiet: bool = False) -> int:
    """Print the snapshot's summary; exit 0, 1 when it cannot be read, 130 on Ctrl+C."""
    cancel = threading.Event()
    shown = [-1]

    def progress(share: float) -> None:
        if quiet or as_json or not sys.stderr.isatty():
            return
        pct = int(share * 100)
        if pct != shown[0]:
            shown[0] = pct
            sys.stderr.write(f"\rtorchmem: reading {path}: {pct}%")
            sys.stderr.flush()

    try:
        index = open_snapshot(path, progress, cancel)
    except KeyboardInterrupt:
        cancel.set()
        sys.stderr.write("\ntorchmem: interrupted\n")
        return 130
    except (SnapshotError, SnapshotCancelled) as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        return 1
    if shown[0] >= 0:
        sys.stderr.write("\n")
    data = snapshot_info(index, top)
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        print(_text(data))
    return 0


def _text(data: dict[str, Any]) -> str:
    lines = [f"{data['file']}: {data['events']:,} events, {data['segments']:,} segments at the end"]
    for d in data["devices"]:
        lines.append(
            f"device {d['device']}: peak active {format_bytes(d['peak_active_bytes'])} at "
            f"{d['peak_time_us'] / 1e6:.3f} s ({d['live_at_peak']:,} allocations live); "
            f"at the end {format_bytes(d['reserved_bytes'])} reserved in {d['segments']} "
            f"segments, {format_bytes(d['allocated_bytes'])} allocated"
        )
        kinds = ", ".join(f"{k} {format_bytes(v)}" for k, v in d["by_category"].items() if v)
        if kinds:
            lines.append(f"  at the peak, by kind: {kinds}")
        for g in d["top_stacks"]:
            lines.append(
                f"  {format_bytes(g['bytes']):>10} in {g['count']:>5,}  {g['category']:<15} "
                f"{g['frame']}"
            )
            if g["tensors"]:
                more = len(g["tensors"]) - 3
                names = ", ".join(g["tensors"][:3]) + (f" +{more} more" if more > 0 else "")
                lines.append(f"  {'':>10}    {'':>5}  {'':<15} tensors: {names}")
    if data.get("names_note"):
        lines.append(f"note: {data['names_note']}")
    return "\n".join(lines)


def diff_headless(before: str, after: str, as_json: bool = False, top: int = 15) -> int:
    """Print how two snapshots' peaks differ, line by line; exit 0, or 1 when either
    cannot be read."""
    try:
        a, b = open_snapshot(before), open_snapshot(after)
    except (SnapshotError, SnapshotCancelled) as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    device = min(set(a.devices) & set(b.devices) or {0})
    peak_a, peak_b, diffs = analysis.compare_peaks(a, b, device)
    data = {
        "before": {"file": a.meta.get("file"), "peak_active_bytes": peak_a},
        "after": {"file": b.meta.get("file"), "peak_active_bytes": peak_b},
        "device": device,
        "peak_change_bytes": peak_b - peak_a,
        "owners": [d.to_json() for d in diffs[:top]],
    }
    if as_json:
        print(json.dumps(data, indent=1))
        return 0
    lines = [
        f"peak active on device {device}: {format_bytes(peak_a)} -> {format_bytes(peak_b)} "
        f"({format_bytes(peak_b - peak_a, signed=True)})",
        "held at each peak, by the line that allocated it (largest change first):",
    ]
    for d in diffs[:top]:
        only = " (only after)" if not d.before else " (only before)" if not d.after else ""
        lines.append(
            f"  {format_bytes(d.change, signed=True):>12}  {format_bytes(d.before):>10} -> "
            f"{format_bytes(d.after):<10} {d.category:<15} {d.frame}{only}"
        )
    print("\n".join(lines))
    return 0
