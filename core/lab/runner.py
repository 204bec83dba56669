"""Run a list of lab jobs, in the worker (a fresh child per measurement) or here.

The caller (``torchmem lab``, the Lab panel's worker thread) hears of each row as it is
measured and may cancel at any time: the worker and the measurement in flight are ended
at once, never left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Literal

from torchmem.lab.measure import Job, Row, measure
from torchmem.probe.parent_watch import PARENT_ENV
from torchmem.sources.children import end_tree

Isolation = Literal["process", "none"]


class LabCancelled(Exception):
    """The user cancelled the lab run."""


class LabError(Exception):
    """The lab cannot run; the message says why."""


def run_lab(
    jobs: Iterable[Job],
    isolation: Isolation = "process",
    on_row: Callable[[Row], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[Row]:
    """Measure every job in order; ``on_row`` hears each row as it comes. LabCancelled
    once ``cancel`` is set (the measurement in flight is abandoned)."""
    cancel = cancel or threading.Event()
    rows: list[Row] = []
    if isolation == "none":
        for job in jobs:
            if cancel.is_set():
                raise LabCancelled()
            rows.append(measure(job))
            if on_row is not None:
                on_row(rows[-1])
        return rows
    worker = _start_worker()
    try:
        for job in jobs:
            if cancel.is_set():
                raise LabCancelled()
            assert worker.stdin is not None
            try:
                worker.stdin.write(json.dumps(asdict(job)) + "\n")
                worker.stdin.flush()
            except BrokenPipeError:
                raise LabError(_died(worker)) from None
            rows.append(Row.from_json(json.loads(_read_line(worker, cancel))))
            if on_row is not None:
                on_row(rows[-1])
    finally:
        _end(worker)
    return rows


def _start_worker() -> subprocess.Popen[str]:
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _end, with the worker
    try:
        worker = subprocess.Popen(
            [sys.executable, "-m", "torchmem.lab.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # A file, not a pipe: a worker that writes much to stderr must never block.
            stderr=stderr,
            text=True,
            env={**os.environ, PARENT_ENV: str(os.getpid())},
            start_new_session=True,
        )
    except OSError as exc:
        stderr.close()
        raise LabError(f"cannot start the lab's worker process: {exc}") from None
    worker.stderr_file = stderr  # type: ignore[attr-defined]
    return worker


def _read_line(worker: subprocess.Popen[str], cancel: threading.Event) -> str:
    """The worker's next line, checking ``cancel`` every 50 ms meanwhile."""
    assert worker.stdout is not None
    while True:
        if cancel.is_set():
            raise LabCancelled()
        ready, _, _ = select.select([worker.stdout], [], [], 0.05)
        if ready:
            line = worker.stdout.readline()
            if not line:
                raise LabError(_died(worker))
            return line


def _died(worker: subprocess.Popen[str]) -> str:
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.wait(2)
    tail = ""
    stderr = getattr(worker, "stderr_file", None)
    if stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            stderr.seek(0)
            text = stderr.read().decode(errors="replace")
            lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("USDT")]
            tail = lines[-1] if lines else ""
    return f"the lab's worker process ended (exit code {worker.returncode})" + (
        f": {tail}" if tail else ""
    )


def _end(worker: subprocess.Popen[str]) -> None:
    """End the worker and the measurement it may be running (its process group)."""
    end_tree(worker, grace_s=0)
    for stream in (worker.stdin, worker.stdout, getattr(worker, "stderr_file", None)):
        with contextlib.suppress(OSError):
            if stream is not None:
                stream.close()
