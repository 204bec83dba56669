"""The C heap's free bytes: memory that RSS counts and malloc only keeps for reuse.

glibc's malloc keeps freed chunks in its arenas (and raises its mmap threshold after the
first large free, so later tensors of a few MiB come from those arenas too). As the arenas
fragment, RSS creeps up a MiB or two a step with nothing leaking: a plateaued cache read
+1.83 MiB/step on a loaded 2-core runner, over the leak detector's threshold. What creeps
is malloc's free bytes, so the detector reads RSS less them (``mallinfo2``, glibc 2.33 and
later: it walks the arenas' bins, under a microsecond here). Elsewhere (musl, macOS,
an older glibc) there is no reading and RSS is read alone.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def heap_free_reader(pid: int | None = None) -> Callable[[], int] | None:
    """A function that returns the bytes malloc holds free in this process, or None where
    it cannot be read (not glibc, glibc before 2.33, or ``pid`` is another process)."""
    if pid is not None and pid != os.getpid():
        return None  # malloc's books are readable from inside the process only
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    mallinfo2.argtypes = []

    def read() -> int:
        return int(mallinfo2().fordblks)

    return read


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim(0)``); False
    where there is no such call (musl, macOS).

    Freed memory stays in malloc's arenas, and RSS counts it: after a run in the window's
    process, a second run started 1.6 GiB above the first until the heap was trimmed. It
    is called where torchmem owns the moment: a run's end, the gc.collect command, a
    tuning trial's start; never from the sampler (it walks the whole heap)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True
