"""The one loop that follows processes torchmem watches, until they end or the user stops.

Following an attached job, the ranks a launched command starts, and an isolated child all
come down to the same thing: look again every so often, stop when told to, give up after
a while. Each caller says what one look does; the pacing, the stop and the deadline live
here once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def follow(
    look: Callable[[], bool],
    stop: threading.Event,
    period_s: float = 0.05,
    duration_s: float | None = None,
) -> bool:
    """Call ``look()`` every ``period_s`` until it returns False (what it follows has
    ended), ``stop`` is set, or ``duration_s`` has passed.

    Returns True when ``look`` ended it, False for a stop or the deadline. A stop set from
    another thread ends the wait at once.
    """
    deadline = time.monotonic() + duration_s if duration_s else None
    while not stop.is_set():
        if not look():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        stop.wait(period_s)
    return False
