"""NVIDIA's management library (NVML), opened once for the whole process.

NVML reads device memory without creating a CUDA context, which costs hundreds of MiB
of device memory and cannot be undone; asking "how much is free on cuda:0" must not
change the answer. Each caller gets None or an empty answer where there is no NVIDIA
driver, never an exception.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def library() -> Any | None:
    """The initialised ``pynvml`` module, or None without a driver (or without pynvml)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def device_count() -> int:
    """How many NVIDIA devices the driver sees (0 without one)."""
    nv = library()
    try:
        return int(nv.nvmlDeviceGetCount()) if nv is not None else 0
    except Exception:
        return 0


def cuda_devices() -> list[str]:
    """``cuda:N`` for every NVIDIA device (NVML's order, as CUDA's by default)."""
    return [f"cuda:{i}" for i in range(device_count())]


def device_memory(device: str) -> tuple[int, int] | None:
    """(free, total) bytes of ``cuda:N`` now, or None where it cannot be read."""
    nv = library()
    if nv is None:
        return None
    try:
        index = int(device.partition(":")[2] or 0)
        info = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index))
        return int(info.free), int(info.total)
    except Exception:
        return None


def bytes_by_pid() -> dict[int, int]:
    """Device memory the driver charges each process, summed over devices."""
    nv = library()
    used: dict[int, int] = {}
    if nv is None:
        return used
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.usedGpuMemory is not None:
                    used[p.pid] = used.get(p.pid, 0) + int(p.usedGpuMemory)
    except Exception:
        pass
    return used
