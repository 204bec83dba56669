"""The memory of a process's workers: DataLoader workers, ``mp.spawn`` ranks, any child.

A DataLoader's workers are forked copies of the training process. Each one's RSS counts
every page it shares with its parent, so four workers of a 2 GiB process read 8 GiB of
RSS that is not there; their memory grows only as they touch (and so copy) pages, the
classic "memory leak with num_workers > 0" of a Python list in a Dataset. What tells is
their USS: the pages each holds alone (its allocations and its copies), which is what the
workers add to the machine beside their parent. (PSS would still charge them a share of
the pages the parent's RSS already counts: 324 MiB for three DataLoader workers of a
482 MiB process in the window, where their USS was 53 MiB.)

Children are found through ``/proc/PID/task/TID/children`` (Linux: a few small reads, not
a scan of every process on a busy server), with psutil's scan as the fallback. torchmem's
own helpers (the memory lab's worker, an isolated run's child, SSH) are not workers.
About 1 ms for three workers here, read every 2 s by the sampler's thread.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil

#: Command-line words of processes that are torchmem's, not the script's.
_HELPERS = ("torchmem", "ssh")
_PROC_LISTS_CHILDREN = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def _children_proc(pid: int) -> list[int] | None:
    """Direct children from /proc (None where the kernel does not list them)."""
    if not _PROC_LISTS_CHILDREN:
        return None
    found: list[int] = []
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []  # the process is gone
    for task in threads:
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except FileNotFoundError:
            if task.exists():  # a kernel without CONFIG_PROC_CHILDREN
                return None
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return found


def _children(pid: int) -> list[int]:
    children = _children_proc(pid)
    if children is None:  # no /proc listing: psutil scans every process
        with contextlib.suppress(psutil.Error):
            return [p.pid for p in psutil.Process(pid).children()]
        return []
    return children


def workers_memory(pid: int | None = None) -> tuple[int, int]:
    """How many workers ``pid`` (this process by default) has, and the sum of their USS
    in bytes. ``(0, 0)`` without any.

    A worker is any descendant but torchmem's own helpers and what they started: a
    process run from another command line that names torchmem or SSH. A forked worker
    has its parent's command line (``torchmem run train.py`` too), so that alone never
    makes a helper.
    """
    root = pid or os.getpid()
    try:
        ours = psutil.Process(root).cmdline()
    except psutil.Error:
        return 0, 0
    count = total = 0
    stack = _children(root)
    while stack:
        child = stack.pop()
        try:
            process = psutil.Process(child)
            command = process.cmdline()
            text = " ".join(command)
            if command != ours and any(word in text for word in _HELPERS):
                continue  # a helper, and its own children with it
            info = process.memory_full_info()
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
        count += 1
        total += int(info.uss)
        stack += _children(child)
    return count, total
