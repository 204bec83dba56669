"""How long a training step takes: one measurement shared by every per-step budget.

Both the boundary readings and the automatic censuses space themselves by the step time.
It is measured once per step here, as the median of recent intervals (an evaluation pass
or a checkpoint between two steps must not make the steps look long), and the median is
recomputed only every few steps, since it runs inside the training loop.
"""

from __future__ import annotations

import statistics
from collections import deque

RECOMPUTE_EVERY = 8


class StepPace:
    """Recent step intervals and their median."""

    def __init__(self, window: int = 31) -> None:
        self._intervals: deque[float] = deque(maxlen=window)
        self._last_t: float | None = None
        self._since = 0
        self.step_time: float | None = None

    def on_step(self, t: float) -> None:
        """Record that a step ended at time ``t`` (seconds)."""
        if self._last_t is not None and t > self._last_t:
            self._intervals.append(t - self._last_t)
            self._since += 1
            if (
                self.step_time is None
                or self._since >= RECOMPUTE_EVERY
                or len(self._intervals) < RECOMPUTE_EVERY
            ):
                self.step_time = statistics.median(self._intervals)
                self._since = 0
        self._last_t = t

    def reset(self) -> None:
        """Forget the measurements (a new run)."""
        self._intervals.clear()
        self._last_t = None
        self._since = 0
        self.step_time = None
