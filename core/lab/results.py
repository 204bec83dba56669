"""The lab's plan and results as data: the jobs a choice of operations, sizes, dtypes
and devices makes, the CSV the command line and the Lab panel write, and the units the
table shows (seconds, bandwidth or FLOP rates)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from torchmem.lab.measure import Job, Row
from torchmem.lab.ops import operation

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


def write_csv(path: str, rows: Sequence[Row]) -> None:
    """Write ``rows`` as CSV (OSError when the file cannot be written)."""
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            data = row.to_json()
            data["saved"] = "; ".join(row.saved)
            writer.writerow(data)


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
