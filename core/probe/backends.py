"""Memory backends: one object per kind of device, all behind one small interface.

A backend adds its readings to a dict of ``"<device>/<metric>" -> bytes``. Backends read
counters only: no device synchronisation, no allocation on a device, no gc, no peak reset
of their own accord. The accelerator backends stay silent until the script itself has
initialised the device, so that monitoring never creates a CUDA context.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psutil

from torchmem.probe.heap import heap_free_reader
from torchmem.probe.torch_import import import_torch
from torchmem.probe.workers import workers_memory


class MemoryBackend:
    """Reads the memory counters of one kind of device; the base reads nothing."""

    #: Device kind, e.g. ``"cpu"``, ``"cuda"``.
    kind: str = "none"
    #: True for devices with their own memory (gets empty_cache and peak resets).
    is_accelerator: bool = False

    def read(self, out: dict[str, float], full: bool = True) -> None:
        """Add this backend's current readings to ``out``.

        ``full=False`` asks for the cheap counters only (taken at step boundaries, inside
        the training loop): costly extras such as USS are left to the sampler thread.
        """

    def capacity(self) -> dict[str, int]:
        """Total memory per device name, where known."""
        return {}

    def empty_cache(self) -> None:
        """Return cached, unused memory to the device (accelerators only)."""

    def reset_peaks(self) -> None:
        """Start new peak figures from now (accelerators only)."""

    def new_run(self) -> None:
        """Forget what the last run taught the backend (a script starts in this process)."""

    @property
    def records_history(self) -> bool:
        """True where PyTorch can record this device's allocations (CUDA, once in use)."""
        return False

    def record_history(self, max_entries: int | None) -> None:
        """Record the newest ``max_entries`` allocation events with their Python stacks,
        or stop recording (``None``). Only where :attr:`records_history`."""
        raise NotImplementedError(f"{self.kind} has no allocation history")

    def dump_snapshot(self, path: str) -> None:
        """Write the allocator's state and recorded history for PyTorch's memory_viz."""
        raise NotImplementedError(f"{self.kind} has no allocation history")


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _open_proc(pid: int, name: str) -> int | None:
    """A descriptor of ``/proc/PID/NAME`` to read again with ``pread``; None without."""
    try:
        return os.open(f"/proc/{pid}/{name}", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # not Linux, or no /proc
        return None


#: A reading of malloc's free bytes slower than this counts towards giving them up.
HEAP_SLOW_S = 3e-4
#: Slow readings in a row that give them up, once step boundaries are read (in the loop).
HEAP_SLOW_STREAK = 3
#: The same before the first boundary: 5 s of slow readings at 10 Hz, no passing import.
HEAP_SLOW_STREAK_BEFORE_LOOP = 50


class ProcessBackend(MemoryBackend):
    """Host memory: process RSS, USS and its workers' USS (at most every ``uss_every_s``),
    system available, and the C heap's free bytes (``cpu/heap_free``) where malloc tells
    (this process, glibc)."""

    kind = "cpu"

    def __init__(self, pid: int | None = None, uss_every_s: float = 2.0) -> None:
        self.process = psutil.Process(pid or os.getpid())
        self.uss_every_s = uss_every_s
        self._next_uss = 0.0
        self._uss_ok = True
        self._heap_free = heap_free_reader(self.process.pid)
        self._heap_slow = 0
        self._heap_loop_seen = False
        self._had_workers = False
        # Kept open and read with pread: inside a training loop, at every reading.
        self._statm = _open_proc(self.process.pid, "statm")
        self._status = _open_proc(self.process.pid, "status")
        for fd in (self._statm, self._status):
            if fd is not None:
                weakref.finalize(self, os.close, fd)

    def new_run(self) -> None:
        """A run's heap is read afresh: the last run's slow readings (a heap fragmented
        by it) gave the reading up, and the next run's trace went missing."""
        self._heap_free = heap_free_reader(self.process.pid)
        self._heap_slow = 0
        self._heap_loop_seen = False

    def _rss(self) -> int:
        """RSS from /proc/PID/statm, kept open: 4.5 us a reading inside a training loop,
        where psutil's memory_info (open, read, close) took 67 us, which spaced the step
        boundaries' readings out on 5 ms steps. psutil elsewhere, and for a dead process
        (its NoSuchProcess is what callers expect)."""
        if self._statm is not None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE
        return self.process.memory_info().rss

    def read(self, out: dict[str, float], full: bool = True) -> None:
        rss = uss = None
        if full and self._uss_ok and time.monotonic() >= self._next_uss:
            self._next_uss = time.monotonic() + self.uss_every_s
            try:
                # USS and RSS of one moment (one read of smaps): a USS read earlier, next to
                # an RSS read later, showed USS 3.3 GiB over RSS 356 MiB after a burst.
                info = self.process.memory_full_info()
                rss, uss = info.rss, min(info.uss, info.rss)
            except (psutil.AccessDenied, AttributeError, NotImplementedError):
                self._uss_ok = False
        out["cpu/rss"] = float(rss if rss is not None else self._rss())
        if uss is not None:
            out["cpu/uss"] = float(uss)
            self._read_workers(out)
        if self._heap_free is not None:  # at every reading: the leak detector nets RSS with it
            self._read_heap_free(self._heap_free, out, in_loop=not full)
        if not full:
            return
        out["system/available"] = float(psutil.virtual_memory().available)
        hwm = kernel_peak_rss(self._status) if self._status is not None else None
        if hwm is not None:
            out["cpu/rss_peak"] = float(hwm)

    def _read_workers(self, out: dict[str, float]) -> None:
        """The USS of the process's workers (DataLoader workers, spawned ranks), with its own:
        a zero once they are gone, then nothing until there are workers again."""
        count, uss = workers_memory(self.process.pid)
        if count or self._had_workers:
            out["cpu/children"] = float(uss)
        self._had_workers = count > 0

    def _read_heap_free(
        self, read: Callable[[], int], out: dict[str, float], in_loop: bool
    ) -> None:
        """Add ``cpu/heap_free``, unless reading it has proved too costly for this process.

        mallinfo2 walks every free chunk: 20-50 us in a training loop, milliseconds in a
        large fragmented heap (the window's process after hours), where it would space the
        step readings out. Over 0.3 ms three times running once the loop has begun, it is
        not read again. Before the first step boundary a streak counts for little: while
        the script imports torch, the heap churns and the sampler's readings took 0.15-0.8
        ms for a second, then 20-50 us; giving up there left RSS un-netted for the whole
        run, and a healthy script's creeping heap raised a leak alert (in CI).
        """
        if in_loop and not self._heap_loop_seen:
            self._heap_loop_seen = True
            self._heap_slow = 0  # the import's streak says nothing of the loop
        started = time.thread_time()
        free = read()
        slow = time.thread_time() - started > HEAP_SLOW_S
        self._heap_slow = self._heap_slow + 1 if slow else 0
        limit = HEAP_SLOW_STREAK if self._heap_loop_seen else HEAP_SLOW_STREAK_BEFORE_LOOP
        if self._heap_slow >= limit:
            self._heap_free = None
        else:
            out["cpu/heap_free"] = float(free)

    def capacity(self) -> dict[str, int]:
        return {"cpu": int(psutil.virtual_memory().total)}


#: Figures of ``torch.cuda.memory_stats`` read at 1 Hz: the fragmentation gauge.
ALLOCATOR_STATS = {
    "alloc_retries": "num_alloc_retries",
    "inactive_split": "inactive_split_bytes.all.current",
    "ooms": "num_ooms",
}


#: Set to "1" in a run's environment to read the allocator's retry count at every step
#: boundary too (tuning trials do, for :mod:`torchmem.retry_streaks`): memory_stats costs
#: tens of microseconds a step, which a measurement run can pay and a training run need not.
RETRIES_ENV = "TORCHMEM_RETRIES_EACH_STEP"


#: Figures of ``torch.cuda.host_memory_stats`` (the pinned host allocator), at 1 Hz.
HOST_STATS = {"pinned": "allocated_bytes.current", "pinned_active": "active_bytes.current"}


class TorchAllocatorBackend(MemoryBackend):
    """CUDA or XPU through PyTorch's caching-allocator counters (``torch.cuda``-like API).

    ``module`` is ``torch.cuda`` or ``torch.xpu``; tests pass a stub with the same
    functions. Devices appear once the script has initialised the runtime.
    """

    is_accelerator = True

    def __init__(self, module: Any, kind: str) -> None:
        self.module = module
        self.kind = kind
        self._capacity: dict[str, int] = {}
        self._next_stats = 0.0
        self._retries_each_step = os.environ.get(RETRIES_ENV) == "1"

    def _active_devices(self) -> list[int]:
        m = self.module
        if not m.is_initialized():
            return []
        current = m.current_device()
        return [i for i in range(m.device_count()) if i == current or m.memory_reserved(i) > 0]

    def read(self, out: dict[str, float], full: bool = True) -> None:
        m = self.module
        devices = self._active_devices()
        if not devices:
            return
        now = time.monotonic()
        stats_due = full and now >= self._next_stats
        if stats_due:
            self._next_stats = now + 1.0  # memory_stats builds a large dict: at most 1 Hz
        for i in devices:
            dev = f"{self.kind}:{i}"
            out[f"{dev}/allocated"] = float(m.memory_allocated(i))
            out[f"{dev}/reserved"] = float(m.memory_reserved(i))
            out[f"{dev}/peak_allocated"] = float(m.max_memory_allocated(i))
            if stats_due and hasattr(m, "memory_stats"):
                stats = m.memory_stats(i)
                for metric, name in ALLOCATOR_STATS.items():
                    value = stats.get(name)
                    if value is not None:
                        out[f"{dev}/{metric}"] = float(value)
            elif self._retries_each_step and not full and hasattr(m, "memory_stats"):
                retries = m.memory_stats(i).get(ALLOCATOR_STATS["alloc_retries"])
                if retries is not None:
                    out[f"{dev}/alloc_retries"] = float(retries)
        if stats_due and self.kind == "cuda" and hasattr(m, "host_memory_stats"):
            # Pinned host memory (DataLoader pin_memory, non_blocking copies): it lives in
            # the process's RSS, held by CUDA's host allocator and its cache.
            pinned = m.host_memory_stats()
            for metric, name in HOST_STATS.items():
                value = pinned.get(name)
                if value is not None:
                    out[f"cpu/{metric}"] = float(value)

    def capacity(self) -> dict[str, int]:
        for i in self._active_devices():
            dev = f"{self.kind}:{i}"
            if dev not in self._capacity:
                self._capacity[dev] = int(self.module.get_device_properties(i).total_memory)
        return dict(self._capacity)

    def empty_cache(self) -> None:
        if self.module.is_initialized():
            self.module.empty_cache()

    def reset_peaks(self) -> None:
        for i in self._active_devices():
            self.module.reset_peak_memory_stats(i)

    @property
    def records_history(self) -> bool:
        # Only once the script has used CUDA: recording would create a CUDA context
        # (hundreds of MiB) in a process that never asked for one.
        memory = getattr(self.module, "memory", None)
        return (
            self.kind == "cuda"
            and hasattr(memory, "_record_memory_history")
            and self.module.is_initialized()
        )

    def record_history(self, max_entries: int | None) -> None:
        if max_entries is None:
            self.module.memory._record_memory_history(enabled=None)
        else:
            self.module.memory._record_memory_history(max_entries=max_entries)

    def dump_snapshot(self, path: str) -> None:
        self.module.memory._dump_snapshot(path)


class MpsBackend(MemoryBackend):
    """Apple MPS: allocated by tensors and allocated by the Metal driver."""

    kind = "mps"
    is_accelerator = True

    def __init__(self, module: Any) -> None:
        self.module = module

    def read(self, out: dict[str, float], full: bool = True) -> None:
        out["mps/allocated"] = float(self.module.current_allocated_memory())
        out["mps/reserved"] = float(self.module.driver_allocated_memory())

    def capacity(self) -> dict[str, int]:
        try:
            return {"mps": int(self.module.recommended_max_memory())}
        except (AttributeError, RuntimeError):
            return {}

    def empty_cache(self) -> None:
        self.module.empty_cache()


class NvmlBackend(MemoryBackend):
    """Per-process GPU memory as the NVIDIA driver reports it (nvidia-smi's figure).

    Used only when an NVIDIA driver answers. Inside containers NVML lists host PIDs, so
    the process may not be found: then this backend reports nothing rather than a guess.
    """

    kind = "nvml"

    def __init__(
        self,
        nvml: ModuleType,
        pid: int | None = None,
        every_s: float = 0.5,
        cuda: Any = None,
    ) -> None:
        """``cuda`` is the watched process's own ``torch.cuda``, given when this backend
        runs inside it: devices are then named as torch numbers them (``cuda:N``).
        Watching another process, torch's numbering is that process's (its
        CUDA_VISIBLE_DEVICES), unknown here: NVML's index is shown as ``gpu:N``."""
        self.nvml = nvml
        self.cuda = cuda
        self.pid = pid or os.getpid()
        self.every_s = every_s
        self._next = 0.0
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._names: list[str] | None = None if cuda else [f"gpu:{i}" for i in range(count)]

    def _device_names(self) -> list[str] | None:
        """The devices' names; None while this process has not initialised CUDA.

        Matching NVML's devices to torch's takes ``get_device_properties``, which
        initialises CUDA. Done before the script does that itself, it would put CUDA in a
        process that may never use it (a CUDA context is hundreds of MiB, and a forked
        DataLoader worker could no longer use CUDA); the GPU check on an H200 caught it.
        A process that has not initialised CUDA has no NVML entry to read anyway.
        """
        if self._names is None and self.cuda.is_initialized():
            self._names = [self._torch_name(i, h) for i, h in enumerate(self._handles)]
        return self._names

    def _torch_name(self, index: int, handle: Any) -> str:
        """``cuda:N`` for the torch device whose UUID NVML's device has; ``gpu:N`` (NVML's
        index) for a device torch does not see (CUDA_VISIBLE_DEVICES), so that it never
        takes a visible device's name; NVML's order where UUIDs cannot be compared."""
        try:
            uuid = self.nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            for i in range(self.cuda.device_count()):
                if str(self.cuda.get_device_properties(i).uuid) in uuid:
                    return f"cuda:{i}"
        except Exception:
            return f"cuda:{index}"
        return f"gpu:{index}"

    def read(self, out: dict[str, float], full: bool = True) -> None:
        now = time.monotonic()
        if not full or now < self._next:
            return
        self._next = now + self.every_s
        names = self._device_names()
        if names is None:
            return
        nvml = self.nvml
        for name, handle in zip(names, self._handles, strict=True):
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError:
                continue
            for proc in procs:
                if proc.pid == self.pid and proc.usedGpuMemory is not None:
                    out[f"{name}/nvml_used"] = float(proc.usedGpuMemory)

    def capacity(self) -> dict[str, int]:
        caps: dict[str, int] = {}
        for name, handle in zip(self._device_names() or (), self._handles, strict=False):
            with contextlib.suppress(self.nvml.NVMLError):
                caps[name] = int(self.nvml.nvmlDeviceGetMemoryInfo(handle).total)
        return caps


def _nvml_backend(pid: int | None, cuda: Any = None) -> MemoryBackend | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return NvmlBackend(pynvml, pid, cuda=cuda)
    except Exception:
        return None


def discover_backends(pid: int | None = None) -> list[MemoryBackend]:
    """Every backend this machine supports: host memory always, accelerators if present."""
    return [ProcessBackend(pid), *accelerator_backends(pid)]


def accelerator_backends(pid: int | None = None) -> list[MemoryBackend]:
    """The accelerators torch has here (CUDA with NVML beside it, XPU, MPS); none without
    torch. Imports torch: a window calls it only once a script needs torch anyway."""
    try:
        torch = import_torch()
    except ImportError:
        return []
    backends: list[MemoryBackend] = []
    if torch.cuda.is_available():
        backends.append(TorchAllocatorBackend(torch.cuda, "cuda"))
        nvml = _nvml_backend(pid, torch.cuda)
        if nvml is not None:
            backends.append(nvml)
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        backends.append(TorchAllocatorBackend(xpu, "xpu"))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        backends.append(MpsBackend(torch.mps))
    return backends


def backends_capacity(backends: list[MemoryBackend]) -> dict[str, int]:
    """Total memory per device over ``backends`` (a backend that fails is skipped)."""
    caps: dict[str, int] = {}
    for backend in backends:
        try:
            caps.update(backend.capacity())
        except Exception:
            continue
    return caps


def process_backends(pid: int) -> list[MemoryBackend]:
    """Backends that watch another process from outside: psutil, and NVML when a driver
    answers (GPU memory as nvidia-smi shows it, CUDA context and caches included)."""
    backends: list[MemoryBackend] = [ProcessBackend(pid)]
    nvml = _nvml_backend(pid)
    if nvml is not None:
        backends.append(nvml)
    return backends


def kernel_peak_rss(status: int | str = "/proc/self/status") -> int | None:
    """The kernel's high-water mark of a process's RSS (``VmHWM`` in its ``status``
    file, a path or a descriptor kept open), in bytes; None without one (not Linux, a
    process gone). A burst between two samples, missed by them, is in it: 200 MiB bursts
    sampled at 10 Hz peaked 15 MiB under it."""
    try:
        if isinstance(status, int):
            text = os.pread(status, 4096, 0)
        else:
            with open(status, "rb") as f:
                text = f.read()
        start = text.index(b"VmHWM:")
        return int(text[start : text.index(b"\n", start)].split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None


def peak_rss() -> int | None:
    """This process's peak resident set size since it started, in bytes, as the kernel
    counts it: ``VmHWM`` (Linux), else ``ru_maxrss``. Unlike a parent's ``wait4``, it
    leaves out the parent's pages a forked child held before its ``exec`` (a child of a
    1 GiB window would otherwise peak at 1 GiB whatever it does)."""
    peak = kernel_peak_rss()
    if peak is not None:
        return peak
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024
    except (ImportError, OSError):
        return None


def reset_peak_rss() -> bool:
    """Restart this process's peak RSS (``VmHWM``) from its current RSS, so that
    :func:`peak_rss` then tells the peak of what follows; False where the kernel cannot
    (not Linux, or a kernel older than 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size (proc(5))
        return True
    except OSError:
        return False
