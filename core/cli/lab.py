"""``torchmem lab``: what tensor operations cost in memory and time, as a table or JSON.

Each (operation, size, dtype, device) is measured by the lab's worker, on the CPU in a
fresh child of it (:mod:`torchmem.lab.runner`, :mod:`torchmem.lab.worker`); rows print
as they come, then one line per operation saying why it costs what it costs. ``--json``
prints the rows as a JSON list instead, ``--csv`` writes them too.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Sequence

from torchmem.lab.measure import Row
from torchmem.lab.ops import BUILTIN, ExpressionError
from torchmem.lab.results import format_rate, format_seconds, jobs_of, write_csv
from torchmem.lab.runner import LabCancelled, LabError, run_lab
from torchmem.units import format_bytes


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
    if csv_path:
        try:
            write_csv(csv_path, rows)
        except OSError as exc:
            sys.stderr.write(f"torchmem: cannot write {csv_path}: {exc.strerror or exc}\n")
            return 1
    return 1 if any(r.error for r in rows) else 0


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


__all__ = ["BUILTIN", "lab_headless"]
