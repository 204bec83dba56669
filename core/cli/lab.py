"""``torchmem lab``: what tensor operations cost in memory and time, as a table or JSON.

Each (operation, size, dtype, device) is measured by the lab's worker, on the CPU in a
fresh child of it (:mod:`torchmem.lab.runner`, :mod:`torchmem.lab.worker`); rows print
as they come, then one line per operation saying why it costs what it costs. ``--json``
prints the rows as a JSON list instead, ``--csv`` writes them too.
"""

from __future__ import annotations

import contextlib
import csv
import json
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from torchmem.lab.measure import Job, Row
from torchmem.lab.ops import BUILTIN, ExpressionError, operation
from torchmem.lab.runner import LabCancelled, LabError, run_lab
from torchmem.units import format_bytes

#: The columns of the table and of ``--csv``, in order.
CSV_COLUMNS = (
    "op", "code", "size", "dtype", "device", "result_bytes", "peak_extra_bytes",
    "allocations", "shares_input_storage", "median_s", "rate", "rate_unit", "saved_bytes",
    "saved", "why", "skipped", "error",
)  # fmt: skip


def jobs_of(
    ops: Sequence[str],
    sizes: Sequence[int],
    dtypes: Sequence[str],
    devices: Sequence[str],
    repeats: int = 5,
    grad: bool = False,
) -> list[Job]:
    """Every combination, operation by operation; ValueError for a bad expression or
    size (checked here, before any process starts)."""
    if not ops:
        raise ValueError("choose at least one operation or expression")
    if not sizes or any(n < 1 for n in sizes):
        raise ValueError("sizes must be positive integers, e.g. 256,1024,4096")
    for op in ops:
        operation(op)  # ExpressionError (a ValueError) says what is wrong
    return [
        Job(op, n, dtype, device, repeats, grad)
        for op in ops
        for dtype in dtypes
        for device in devices
        for n in sizes
    ]


def lab_headless(
    ops: Sequence[str],
    sizes: Sequence[int],
    dtypes: Sequence[str],
    devices: Sequence[str],
    repeats: int = 5,
    grad: bool = False,
    as_json: bool = False,
    csv_path: str | None = None,
    in_process: bool = False,
) -> int:
    """Measure and print; exit 0, 1 when a row failed, 2 for bad options, 130 on Ctrl+C."""
    try:
        jobs = jobs_of(ops, sizes, dtypes, devices, repeats, grad)
    except (ValueError, ExpressionError) as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        return 2
    if not as_json:
        print(_header(grad))
    cancel = threading.Event()

    out = sys.stdout

    def on_row(row: Row) -> None:
        if not as_json:
            print(_line(row, grad), file=out, flush=True)

    try:
        # Measured here, an expression's prints would interleave with the table or the
        # JSON: they go to stderr, as the worker process sends them.
        with contextlib.redirect_stdout(sys.stderr):
            rows = run_lab(jobs, "none" if in_process else "process", on_row, cancel)
    except KeyboardInterrupt:
        cancel.set()
        sys.stderr.write("torchmem: lab interrupted\n")
        return 130
    except (LabError, LabCancelled) as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        return 1
    if as_json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
    else:
        print(_legend(rows))
    if csv_path and not write_csv(csv_path, rows):
        return 1
    return 1 if any(r.error for r in rows) else 0


def write_csv(path: str, rows: Sequence[Row]) -> bool:
    """Write ``rows`` as CSV; False (said on stderr) when the file cannot be written."""
    try:
        with Path(path).open("w", newline="") as f:
            writer = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                data = row.to_json()
                data["saved"] = "; ".join(row.saved)
                writer.writerow(data)
    except OSError as exc:
        sys.stderr.write(f"torchmem: cannot write {path}: {exc.strerror or exc}\n")
        return False
    return True


def _header(grad: bool) -> str:
    cols = (
        f"{'operation':<16} {'size':>6} {'dtype':<9} {'device':<7} {'new storage':>12} "
        f"{'peak extra':>12} {'allocs':>6} {'shares':>6} {'median':>10} {'rate':>14}"
    )
    return cols + (f" {'saved for bwd':>14}" if grad else "")


def _line(row: Row, grad: bool) -> str:
    head = f"{row.op[:16]:<16} {row.size:>6} {row.dtype:<9} {row.device:<7} "
    if row.skipped or row.error:
        return head + ("skipped: " + row.skipped if row.skipped else "error: " + row.error)
    shares = "yes" if row.shares_input_storage else "no"
    line = (
        head + f"{_bytes(row.result_bytes):>12} {_bytes(row.peak_extra_bytes):>12} "
        f"{row.allocations if row.allocations is not None else '-':>6} {shares:>6} "
        f"{format_seconds(row.median_s):>10} {format_rate(row.rate, row.rate_unit):>14}"
    )
    return line + (f" {_bytes(row.saved_bytes):>14}" if grad else "")


def _legend(rows: Sequence[Row]) -> str:
    seen: dict[str, str] = {}
    for row in rows:
        if row.op not in seen and (row.why or row.saved):
            saved = f" Saved for backward: {', '.join(row.saved)}." if row.saved else ""
            seen[row.op] = (
                f"  {row.op}: {row.code + ' — ' if row.code != row.op else ''}{row.why}.{saved}"
            )
    return "why:\n" + "\n".join(seen.values()) if seen else ""


def _bytes(value: int | None) -> str:
    return format_bytes(value) if value is not None else "-"


def format_seconds(value: float | None) -> str:
    """``12.3 µs``, ``4.56 ms``, ``1.23 s``."""
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.1f} µs"
    if value < 1:
        return f"{value * 1e3:.2f} ms"
    return f"{value:.2f} s"


def format_rate(value: float | None, unit: str) -> str:
    """``12.3 GB/s`` or ``4.56 TFLOP/s`` (decimal prefixes, as bandwidths are quoted)."""
    if value is None:
        return "-"
    base = "FLOP/s" if unit == "FLOP/s" else "B/s"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{base}"
    return f"{value:.3g} {base}"


__all__ = ["BUILTIN", "CSV_COLUMNS", "jobs_of", "lab_headless", "write_csv"]
