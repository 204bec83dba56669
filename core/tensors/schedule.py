"""When to take a census at step boundaries without slowing training more than a budget.

A census stalls the training loop while it walks the heap. Taken every N steps it costs
``duration / (N * step_time)`` of the run. With no fixed N, the schedule picks the smallest
N that keeps that share under ``budget`` (1 % by default), from the measured step time and
the last census's duration; so a census that costs more than 1 % of a step is never taken
at every step. A fixed ``every`` overrides it; ``enabled=False`` turns it off.
"""

from __future__ import annotations

import math

from torchmem.probe.step_pace import StepPace


class CensusSchedule:
    """Decides, at each step boundary, whether a census is due."""

    def __init__(
        self,
        every: int | None = None,
        budget: float = 0.01,
        warmup: int = 2,
        enabled: bool = True,
        pace: StepPace | None = None,
    ) -> None:
        self.every = every
        self.budget = budget
        self.warmup = warmup
        self.enabled = enabled
        self.pace = pace or StepPace()
        self.cost: float | None = None
        self.last_step: int | None = None

    @property
    def step_time(self) -> float | None:
        """Median recent step time (from the shared :class:`StepPace`)."""
        return self.pace.step_time

    @property
    def interval(self) -> int | None:
        """Steps between censuses now (``None`` until a step time and a cost are known)."""
        if self.every:
            return self.every
        if self.cost is None or not self.step_time:
            return None
        return max(1, math.ceil(self.cost / (self.budget * self.step_time)))

    @property
    def overhead(self) -> float | None:
        """Share of the run spent in censuses at the current interval."""
        interval = self.interval
        if interval is None or self.cost is None or not self.step_time:
            return None
        return self.cost / (interval * self.step_time)

    def on_step(self, step: int) -> bool:
        """True when a census is due at ``step`` (the pace is fed by the caller)."""
        if not self.enabled or step < self.warmup:
            return False
        if self.last_step is None:
            return True
        interval = self.interval
        return interval is not None and step - self.last_step >= interval

    def record(self, step: int, duration_s: float) -> None:
        """A census was taken at ``step`` and took ``duration_s``."""
        self.last_step = step
        self.cost = duration_s

    def reset(self) -> None:
        """Forget the measurements (a new run)."""
        self.cost = None
        self.last_step = None
