"""The figures a benchmark hands to the harness (``python -m benchmarks``).

Each script prints its own detailed tables and, through :func:`row`, the few figures
that have a target. The harness names a file in ``TORCHMEM_BENCH_ROWS``; every row is
appended to it at once as a JSON line, so that a benchmark that crashes half-way still
reports what it measured. Run alone, a script just prints.
"""

from __future__ import annotations

import json
import os

ROWS_ENV = "TORCHMEM_BENCH_ROWS"


def row(figure: str, value: str, target: str = "", met: bool | None = None, how: str = "") -> None:
    """Report one figure: its formatted ``value``, the ``target`` it is held to ("" for
    none), whether it ``met`` it (None: no target), and ``how`` it was measured."""
    path = os.environ.get(ROWS_ENV)
    if not path:
        return
    data = {"figure": figure, "value": value, "target": target, "met": met, "how": how}
    with open(path, "a") as f:
        f.write(json.dumps(data) + "\n")


def ratio_row(figure: str, ratio: float, limit: float, how: str) -> None:
    """A step-time (or any) ratio held to ``<= limit``."""
    row(figure, f"{ratio:.3f}x", f"<= {limit:g}x", ratio <= limit, how)
