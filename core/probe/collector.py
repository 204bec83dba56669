"""The cyclic garbage collector paused for a block of work that makes many objects and no
garbage: importing torch, reading a snapshot, a tensor census. The collector would walk
the new objects again and again while they appear (see where each is used for what that
cost); its state is put back as it was, and nothing is collected on the caller's behalf.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block, then back as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
