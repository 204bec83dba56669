"""Measure a ``step(batch_size)`` function in the process that calls it.

``torchmem.tune`` runs this in a child forked from the caller (a notebook's function that
no other process can import) and, when asked, in the caller itself. It answers with the
keys of ``torchmem run --summary``, so that these trials are judged by the same code as a
script's (:func:`torchmem.tuning.trial.measured_trial`).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from torchmem.probe.backends import peak_rss, reset_peak_rss
from torchmem.probe.heap import trim_heap
from torchmem.probe.runner import is_oom
from torchmem.retry_streaks import METRIC as RETRIES
from torchmem.retry_streaks import RetryStreaks

#: A message longer than this is cut (it travels through a pipe from a forked trial).
MESSAGE_CHARS = 2000


def accelerator(device: str) -> tuple[Any, int] | None:
    """The torch module that counts ``device``'s memory (``torch.cuda``, ``torch.xpu``)
    and the device index; None for ``cpu``. ValueError for a device torch cannot count."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return None
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    module = getattr(torch, kind, None)
    if module is None or not hasattr(module, "max_memory_reserved"):
        raise ValueError(f"torch cannot count the peak memory of {device!r}: tune on cpu or cuda")
    return module, int(index or 0)


def measure_calls(fn: Callable[[int], Any], batch: int, steps: int, device: str) -> dict[str, Any]:
    """Call ``fn(batch)`` once to warm up and ``steps`` times more, and report the peak
    memory over all of them: this process's peak RSS on CPU (restarted first, where the
    kernel allows), the allocator's peak allocated and reserved bytes on an accelerator.
    An exception ends the calls; an out-of-memory error (by type, then by message) is
    reported as such, never raised."""
    accel = accelerator(device)
    if accel is None:
        trim_heap()
        reset_peak_rss()
    else:
        module, index = accel
        module.synchronize(index)
        module.empty_cache()  # what an earlier trial of this process left cached is not ours
        module.reset_peak_memory_stats(index)
    times: list[float] = []
    retries = RetryStreaks()
    status, message, code = "finished", "", 0
    try:
        for step in range(steps + 1):
            started = time.perf_counter()
            fn(batch)
            if accel is not None:
                accel[0].synchronize(accel[1])  # a trial may sync: it is not the user's run
            times.append(time.perf_counter() - started)
            if accel is not None:  # each call's retries: a size that thrashes does not fit
                count = accel[0].memory_stats(accel[1]).get("num_alloc_retries", 0)
                retries.on_boundary(step, {f"{device}/{RETRIES}": float(count)})
    except Exception as exc:
        oom = is_oom(exc)
        status, code = ("out of memory" if oom else "failed"), 1
        message = f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]
        del exc  # its traceback holds the failed step's tensors
    summary: dict[str, Any] = {
        "status": status,
        "message": message,
        "exit_code": code,
        "steps": len(times),
        "step_time_s": statistics.median(times[1:]) if len(times) > 1 else None,
        "peak_rss_bytes": peak_rss(),
        "peak_bytes": {},
        "peak_reserved_bytes": {},
    }
    if accel is not None:
        module, index = accel
        summary["peak_bytes"] = {device: int(module.max_memory_allocated(index))}
        summary["peak_reserved_bytes"] = {device: int(module.max_memory_reserved(index))}
        summary["alloc_retry_steps"] = retries.longest()
        if code:
            gc.collect()  # what the failed step left (in this process) goes back to the device
            module.empty_cache()
    return summary
