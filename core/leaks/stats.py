"""Robust trend statistics for leak detection: Theil-Sen slopes and Mann-Kendall tests.

Both look at every pair of readings, so a spike or two (an evaluation pass, a big batch)
moves neither; the floor of the readings (a trailing minimum) is what a leak raises.
"""

from __future__ import annotations

import math

import numpy as np

_PAIRS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs i < j for n points, cached (the window has few distinct sizes)."""
    pairs = _PAIRS.get(n)
    if pairs is None:
        pairs = _PAIRS[n] = np.triu_indices(n, k=1)
    return pairs


def trailing_floor(y: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing minimum of ``y`` over ``span`` points (shorter at the start), and where
    each minimum was read (its index in ``y``, the oldest of equal ones).

    A floor belongs at the reading it came from: placed at the newest reading instead,
    a rising series starts with ``span`` copies of its first value, flat, and the slope
    over a short window reads low (a 2 MiB/step leak read 1.27 at step 26 when readings
    came every third step).
    """
    index = np.arange(len(y))
    if span <= 1 or len(y) < 2:
        return y, index
    windows = np.lib.stride_tricks.sliding_window_view(
        np.concatenate((np.full(span - 1, np.inf), y)), span
    )
    where = index - (span - 1) + windows.argmin(axis=1)
    return y[where], where


def theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    """Median of the slopes between every pair of points (robust to outliers)."""
    i, j = _pairs(len(x))
    dx = x[j] - x[i]
    keep = dx != 0
    if not keep.any():
        return 0.0
    return float(np.median((y[j] - y[i])[keep] / dx[keep]))


def mann_kendall_p(y: np.ndarray) -> float:
    """One-sided p-value that ``y`` rises monotonically (normal approximation, no tie
    correction: memory readings rarely tie exactly, and ties only make it stricter)."""
    n = len(y)
    if n < 4:
        return 1.0
    i, j = _pairs(n)
    s = float(np.sign(y[j] - y[i]).sum())
    if s <= 1:
        return 1.0
    z = (s - 1) / math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    return 0.5 * math.erfc(z / math.sqrt(2))
