"""The lab's worker: measures each job in a fresh child forked from it, or, on an
accelerator, in itself.

Started once per lab run (``python -m torchmem.lab.worker``), it imports torch and then
reads one JSON job a line on stdin. A CPU job is measured in a child forked for it, so
that the heap left by earlier rows never hides a later row's allocations, and a crash
costs one row; the worker runs no torch operation itself (OpenMP's threads do not survive
a fork: the children start them fresh).

An accelerator job cannot be forked: starting the profiler, or asking whether CUDA is
there, initialises the CUDA driver, and a child forked after that fails its first CUDA
call with "initialization error" (every CUDA row did, on an H200). It is measured in the
worker, where it needs no fresh heap: the allocator's own counters give exact peaks
whatever its cache holds, and the cache is returned to the device after each row, so
that the lab never sits on memory a training run beside it needs.
It answers one JSON row a line on its stdout, in order. That stream is its own: an
expression that prints (``print("x") or a``) writes to fd 1, which the worker points at
its stderr before any job runs, so that user output never lands inside a row.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from typing import Any

from torchmem.lab.measure import Job, Row, measure
from torchmem.probe.torch_import import import_torch
from torchmem.sources.children import signal_name


def measure_in_child(job: Job) -> dict[str, Any]:
    """Fork, measure ``job`` in the child, and return its row as JSON."""
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(readable)
            # The profiler's C++ side announces each start on fd 2: not a line per row.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            data = json.dumps(measure(job).to_json(), default=str).encode()
            while data:
                data = data[os.write(writable, data) :]
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(writable)
    chunks = []
    while chunk := os.read(readable, 1 << 16):  # until the child closes its end
        chunks.append(chunk)
    os.close(readable)
    _, status = os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        code = os.waitstatus_to_exitcode(status)
        how = f"signal {signal_name(code)}" if code < 0 else f"exit code {code}"
        row = Row(job.op, job.size, job.dtype, job.device)
        row.error = f"the measurement's process died ({how}) before it reported"
        return row.to_json()


def device_type(job: Job) -> str:
    """The kind of ``job``'s device: ``cpu``, ``cuda`` (for ``cuda:0``), ``xpu``, ``mps``."""
    return job.device.split(":", 1)[0].strip().lower()


def answer(job: Job) -> dict[str, Any]:
    """``job``'s row as JSON: measured in a forked child on the CPU, here on a device."""
    kind = device_type(job)
    if kind == "cpu":
        return measure_in_child(job)
    try:
        return measure(job).to_json()
    finally:
        import torch

        backend = getattr(torch, kind, None)
        if backend is not None and hasattr(backend, "empty_cache"):
            with contextlib.suppress(Exception):  # a device that never started: no cache
                backend.empty_cache()


def private_results() -> Any:
    """A text stream on a duplicate of fd 1 for the rows; fd 1 and ``sys.stdout`` then
    write to stderr (what a measured expression prints goes there, forked children too)."""
    results = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)
    return results


def main() -> None:
    """Serve jobs from stdin until it closes."""
    results = private_results()
    import_torch()  # imported once here, so that each child starts at once

    from torchmem.lab.measure import warm_up

    warm_up()

    from torchmem.probe.parent_watch import PARENT_ENV, set_pdeathsig

    if os.environ.get(PARENT_ENV):
        set_pdeathsig(signal.SIGKILL)  # the worker ends with the window or the CLI
    for line in sys.stdin:
        if not line.strip():
            continue
        job = Job(**json.loads(line))
        results.write(json.dumps(answer(job), default=str) + "\n")
        results.flush()


if __name__ == "__main__":
    main()
