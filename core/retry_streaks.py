"""Steps on which the caching allocator had to retry: the thrash a batch size causes just
under its out-of-memory point.

When a ``cudaMalloc`` fails, PyTorch's allocator frees its whole cache and tries again
(``num_alloc_retries``). The step still succeeds, slower; a size whose every step does
this is at the edge, and the next run of it may not succeed. Composer's automatic
microbatching counts such a size as not fitting when the retries come on two
consecutive steps, and so does torchmem's search.

Fed by the Session with the readings taken at step boundaries (a reading at a step's end
says what that step did); only a run that reads the count at each boundary (a tuning
trial: :data:`torchmem.probe.backends.RETRIES_ENV`) has them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchmem.series import split_key

#: The series of the allocator's retry count (``cuda:0/alloc_retries``).
METRIC = "alloc_retries"


@dataclass
class _Streak:
    step: int  # the step of the last boundary reading
    count: float  # the retry count then
    current: int = 0  # consecutive steps with retries, ending at ``step``
    longest: int = 0


class RetryStreaks:
    """The longest run of consecutive steps with allocator retries, per device series
    (``cuda:0``, ``rank1/cuda:1``)."""

    def __init__(self) -> None:
        self._of: dict[str, _Streak] = {}

    def on_boundary(self, step: int, values: dict[str, float]) -> None:
        """Take the readings of the boundary of ``step``."""
        for key, value in values.items():
            device, metric = split_key(key)
            if metric != METRIC:
                continue
            seen = self._of.get(device)
            if seen is None:
                self._of[device] = _Streak(step, value)
                continue
            if step <= seen.step:  # a repeated or late boundary: nothing new
                continue
            if value > seen.count:
                # A rise over more than one step cannot say which of them retried: it
                # counts as one, never as a streak it may not have been.
                seen.current = seen.current + 1 if step == seen.step + 1 else 1
                seen.longest = max(seen.longest, seen.current)
            else:
                seen.current = 0
            seen.step, seen.count = step, value

    def longest(self) -> dict[str, int]:
        """``{device: steps}`` for every device whose retry count was read at boundaries
        (0 where it never rose)."""
        return {device: s.longest for device, s in self._of.items()}
