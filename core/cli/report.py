"""``torchmem report`` and ``torchmem sessions``: recorded runs, read back headless.

A report is the run summary (the same schema as ``--summary``) rebuilt by replaying the
session file into a Session, with what only the end of the run knew (the runner's step
count, the kernel's peak RSS) taken from the summary the recorder stored, when the run
got that far. A run whose recording stops without its end (``kill -9``, a crash, the OOM
killer) is reported as ``killed or crashed`` with what was recorded until then.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from torchmem.leaks.oom import explain_oom
from torchmem.record.census_diff import diff_by_name, recorded_censuses
from torchmem.record.compare import compare_row, peak_keys, run_labels
from torchmem.record.library import list_sessions, sessions_dir
from torchmem.record.replay import Recording, load
from torchmem.record.store import RecordError
from torchmem.report.recorded import export_csv, recorded_summary
from torchmem.report.summary import write_summary
from torchmem.series import scope_label
from torchmem.session import peak_label
from torchmem.units import format_bytes, format_duration


def report(
    path: str,
    as_json: bool,
    summary_path: str | None,
    csv_path: str | None,
    export_dir: str | None = None,
) -> int:
    """``torchmem report``: 0, or 2 when the file cannot be read (1 when an export
    cannot be written)."""
    try:
        recording = load(path)
    except RecordError as exc:
        print(f"torchmem: {exc}", file=sys.stderr)
        return 2
    data = recorded_summary(recording)
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        print(_text(recording, data))
    for problem in recording.problems:
        print(f"torchmem: {path}: {problem}", file=sys.stderr)
    if summary_path and not write_summary(summary_path, data):
        return 1
    if csv_path:
        try:
            rows = export_csv(Path(path), Path(csv_path))
        except (OSError, RecordError) as exc:
            print(f"torchmem: cannot export the samples: {exc}", file=sys.stderr)
            return 1
        print(f"torchmem: wrote {rows:,} samples to {csv_path}", file=sys.stderr)
    if export_dir:
        return export_all(Path(path), data, Path(export_dir))
    return 0


def export_all(path: Path, data: dict[str, Any], folder: Path) -> int:
    """Write the samples, the summary and the run's memory snapshots into ``folder``;
    0, or 1 when something could not be written (said on stderr)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        rows = export_csv(path, folder / "samples.csv")
    except (OSError, RecordError) as exc:
        print(f"torchmem: cannot export into {folder}: {exc}", file=sys.stderr)
        return 1
    if not write_summary(str(folder / "summary.json"), data):
        return 1
    copied, missing = [], []
    for snapshot in data.get("snapshots", []):
        source = Path(snapshot)
        try:
            shutil.copyfile(source, folder / source.name)
            copied.append(source.name)
        except OSError:
            missing.append(snapshot)  # taken on another machine, or since removed
    print(
        f"torchmem: exported into {folder}: samples.csv ({rows:,} samples), summary.json"
        + "".join(f", {name}" for name in copied),
        file=sys.stderr,
    )
    for snapshot in missing:
        print(
            f"torchmem: the snapshot {snapshot} is not on this machine (taken where the run "
            "ran?): not exported",
            file=sys.stderr,
        )
    return 0


def _text(recording: Recording, data: dict[str, Any]) -> str:
    meta = recording.meta
    argv = " ".join(data.get("argv") or [])
    lines = [
        f"Session   {recording.path}",
        f"Script    {data.get('script') or '-'} {argv}".rstrip(),
        f"Recorded  {meta.get('created', '?')} on {meta.get('host', '?')}, "
        f"torch {meta.get('torch_version') or '?'}, torchmem {meta.get('torchmem_version', '?')}",
        (
            f"Ended     {data['status']} (exit code {data['exit_code']}) after "
            f"{format_duration(data['duration_s'])}: {data['message']}"
            if "status" in data
            else f"Ended     {data['message']}"
        ),
        f"Steps     {data['steps']:,}"
        + (f", {data['step_time_s'] * 1000:.1f} ms per step" if data.get("step_time_s") else ""),
        f"Samples   {data['samples']:,}",
    ]
    allocator = meta.get("allocator") or {}
    if allocator:
        lines.append("Allocator " + ", ".join(f"{k}={v}" for k, v in allocator.items()))
    for key, value in data["peak_bytes"].items():
        lines.append(f"Peak      {peak_label(key)}: {format_bytes(value)}")
    if data.get("peak_rss_bytes"):
        kernel = format_bytes(data["peak_rss_bytes"])
        lines.append(f"Peak      RSS as the kernel counts it: {kernel}")
    for alert in data["alerts"]:
        lines.append(f"Alert     {alert['severity'].upper()} {alert['kind']}: {alert['message']}")
        if alert["suggestion"]:
            lines.append(f"          fix: {alert['suggestion']}")
    if not data["alerts"]:
        lines.append("Alerts    none")
    for path in data.get("snapshots", []):
        lines.append(f"Snapshot  {path} (drop it on https://pytorch.org/memory_viz)")
    oom = explain_oom(recording.session)
    if oom is not None:
        lines += oom.lines()
    return "\n".join(lines)


def sessions(folder: str | None, as_json: bool) -> int:
    """``torchmem sessions``: the recorded sessions, newest first."""
    where = Path(folder) if folder else sessions_dir()
    entries = list_sessions(where)
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "path": str(e.path),
                        "title": e.title,
                        "created": e.meta.get("created"),
                        "status": e.status,
                        "duration_s": round(e.last_t, 3),
                        "samples": e.samples,
                        "peak_bytes": e.peak_bytes,
                        "alerts": e.alerts,
                        "size_bytes": e.size,
                        "error": e.error or None,
                    }
                    for e in entries
                ],
                indent=2,
            )
        )
        return 0
    if not entries:
        print(f"No recorded sessions in {where}. Record one: torchmem run --record FILE SCRIPT")
        return 0
    print(
        f"{'CREATED':<20} {'SCRIPT':<24} {'STATUS':<18} {'DURATION':>9} {'PEAK':>10} "
        f"{'ALERTS':>6} {'SIZE':>9}  FILE"
    )
    for e in entries:
        created = str(e.meta.get("created", ""))[:19].replace("T", " ")
        peak = format_bytes(e.peak_bytes) if e.peak_bytes is not None else "-"
        print(
            f"{created:<20} {e.title[:24]:<24} {e.status:<18} "
            f"{format_duration(e.last_t):>9} {peak:>10} {e.alerts:>6} "
            f"{format_bytes(e.size):>9}  {e.path}"
        )
        if e.error:
            print(f"{'':<20} {e.error}")
    return 0


def compare(paths: list[str], as_json: bool) -> int:
    """``torchmem compare``: recorded runs side by side; 2 when a file cannot be read."""
    recordings = []
    for path in paths:
        try:
            recordings.append(load(path))
        except RecordError as exc:
            print(f"torchmem: {exc}", file=sys.stderr)
            return 2
    rows = [
        compare_row(r, recorded_summary(r), label)
        for r, label in zip(recordings, run_labels(recordings), strict=True)
    ]
    if as_json:
        print(json.dumps([row.to_json() for row in rows], indent=2))
        return 0
    devices = peak_keys(rows)
    name_width = max(len(row.name) for row in rows)
    header = f"{'RUN':<{name_width}}  {'ENDED':<18} {'DURATION':>9} {'STEPS':>7} {'STEP':>9}"
    header += "".join(f" {'PEAK ' + peak_label(d):>20}" for d in devices)
    print(header + "  ALERTS  ALLOCATOR")
    first = rows[0]
    for row in rows:
        step = f"{row.step_time_s * 1000:.1f} ms" if row.step_time_s else "-"
        line = (
            f"{row.name:<{name_width}}  {row.status:<18} {format_duration(row.duration_s):>9} "
            f"{row.steps:>7,} {step:>9}"
        )
        for device in devices:
            value, base = row.peaks.get(device), first.peaks.get(device)
            text = format_bytes(value) if value is not None else "-"
            if row is not first and value is not None and base:
                text += f" {100 * (value - base) / base:+.0f}%"
            line += f" {text:>20}"
        allocator = ", ".join(f"{k}={v}" for k, v in row.allocator.items()) or "defaults"
        print(f"{line}  {row.alerts:>6}  {allocator}")
    return 0


def censuses(path: str, diff: list[int] | None) -> int:
    """``torchmem report --censuses`` (the list) and ``--diff A B`` (two of them by name)."""
    try:
        taken = recorded_censuses(path)
    except RecordError as exc:
        print(f"torchmem: {exc}", file=sys.stderr)
        return 2
    if not taken:
        print(f"torchmem: {path} holds no census (the run took none)", file=sys.stderr)
        return 1
    if not diff:
        print(f"{'#':>3} {'STEP':>7} {'TIME':>9} {'TOTAL':>11} {'STORAGES':>9}  WHY")
        for i, event in enumerate(taken, start=1):
            c = event.census
            print(
                f"{i:>3} {event.step:>7,} {event.t:>8.1f}s {format_bytes(c.total_bytes()):>11} "
                f"{len(c.storages):>9,}  {event.trigger}"
                + (f" ({scope_label(event.scope)})" if event.scope else "")
            )
        return 0
    a, b = diff
    if not (1 <= a <= len(taken) and 1 <= b <= len(taken)):
        print(
            f"torchmem: {path} holds censuses 1 to {len(taken)}, not {a} and {b} (see --censuses)",
            file=sys.stderr,
        )
        return 2
    before, after = taken[a - 1], taken[b - 1]
    rows = diff_by_name(before.census, after.census)
    total = after.census.total_bytes() - before.census.total_bytes()
    print(
        f"census {a} (step {before.step:,}) -> census {b} (step {after.step:,}): "
        f"{format_bytes(before.census.total_bytes())} -> "
        f"{format_bytes(after.census.total_bytes())} ({format_bytes(total, signed=True)})"
    )
    for row in rows:
        counts = f" x{row.count_after}" if row.count_after > 1 else ""
        print(f"{row.change:>7} {format_bytes(row.delta, signed=True):>12}  {row.name}{counts}")
    if not rows:
        print("no tensor changed")
    return 0
