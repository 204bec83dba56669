"""Bounded time series: recent samples at full rate, older ones as min/max buckets.

A 24-hour run at 10 Hz is 864,000 samples per series. Keeping them all is wasteful and
drawing them is slow; dropping them hides the peak that mattered. Each series therefore
keeps its last ``recent`` samples exactly, and folds older ones into buckets that keep the
minimum and maximum. When the bucket store fills, neighbouring buckets merge (the bucket
width doubles), so memory stays bounded for any run length and no peak is ever lost.
"""

from __future__ import annotations

import numpy as np


class SeriesBuffer:
    """One series: a ring of recent ``(t, value)`` samples plus a min/max history."""

    def __init__(self, recent: int = 6000, buckets: int = 2048, bucket_width: int = 10) -> None:
        if recent < 2 or buckets < 2 or bucket_width < 1:
            raise ValueError("recent and buckets must be >= 2, bucket_width >= 1")
        self._t = np.empty(recent, dtype=np.float64)
        self._v = np.empty(recent, dtype=np.float64)
        self._start = 0
        self._len = 0
        # History buckets: time of first and last sample, min and max value.
        self._hist = np.empty((buckets, 4), dtype=np.float64)
        self._hist_len = 0
        self._bucket_width = bucket_width
        self._pending: list[float] | None = None  # [t0, t1, vmin, vmax, count]
        self.count = 0
        self.peak = -np.inf
        self.last = np.nan
        #: Time of the last sample (NaN before the first): how fresh ``last`` is.
        self.last_t = np.nan

    @property
    def bucket_width(self) -> int:
        """How many raw samples one history bucket stands for now."""
        return self._bucket_width

    @property
    def nbytes(self) -> int:
        """Memory held by the buffers (constant after construction)."""
        return self._t.nbytes + self._v.nbytes + self._hist.nbytes

    def append(self, t: float, value: float) -> None:
        """Add one sample; the oldest recent sample moves to the history when full."""
        cap = len(self._t)
        if self._len == cap:
            self._fold(self._t[self._start], self._v[self._start])
            idx = self._start
            self._start = (self._start + 1) % cap
        else:
            idx = (self._start + self._len) % cap
            self._len += 1
        self._t[idx] = t
        self._v[idx] = value
        self.count += 1
        self.last = value
        self.last_t = t
        if value > self.peak:
            self.peak = value

    def extend(self, t: np.ndarray, values: np.ndarray) -> None:
        """Add many samples at once, exactly as that many :meth:`append` calls would
        (a reopened recording seeds its series with ~10,000 readings each)."""
        t = np.asarray(t, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64)
        n = len(t)
        if n == 0:
            return
        cap = len(self._t)
        overflow = self._len + n - cap
        if overflow > 0:  # the oldest of the ring and the new ones fold into the history
            old_t, old_v = self.recent()
            all_t, all_v = np.concatenate((old_t, t)), np.concatenate((old_v, values))
            self._fold_many(all_t[:overflow], all_v[:overflow])
            self._t[:], self._v[:] = all_t[overflow:], all_v[overflow:]
            self._start, self._len = 0, cap
        else:
            idx = (self._start + self._len + np.arange(n)) % cap
            self._t[idx], self._v[idx] = t, values
            self._len += n
        self.count += n
        self.last, self.last_t = float(values[-1]), float(t[-1])
        top = np.fmax.reduce(values)  # NaN only when every value is, as append skips NaN
        if top > self.peak:
            self.peak = float(top)

    def _fold_many(self, t: np.ndarray, v: np.ndarray) -> None:
        """:meth:`_fold` of each sample in order, a bucket's worth at a time."""
        i = 0
        while i < len(t):
            p = self._pending
            take = min(self._bucket_width - (p[4] if p else 0), len(t) - i)
            chunk = v[i : i + take]
            lo, hi = float(np.fmin.reduce(chunk)), float(np.fmax.reduce(chunk))
            if p is None:
                p = self._pending = [float(t[i]), float(t[i + take - 1]), lo, hi, take]
            else:
                p[1] = float(t[i + take - 1])
                p[2], p[3] = min(p[2], lo), max(p[3], hi)
                p[4] += take
            i += take
            if p[4] >= self._bucket_width:  # the width read afresh: a merge doubles it
                self._push_bucket(p[0], p[1], p[2], p[3])
                self._pending = None

    def reset_peak(self) -> None:
        """Forget the peak so far; the next sample starts a new one."""
        self.peak = self.last if not np.isnan(self.last) else -np.inf

    def _fold(self, t: float, v: float) -> None:
        p = self._pending
        if p is None:
            self._pending = [t, t, v, v, 1]
            p = self._pending
        else:
            p[1] = t
            p[2] = min(p[2], v)
            p[3] = max(p[3], v)
            p[4] += 1
        if p[4] >= self._bucket_width:
            self._push_bucket(p[0], p[1], p[2], p[3])
            self._pending = None

    def _push_bucket(self, t0: float, t1: float, vmin: float, vmax: float) -> None:
        if self._hist_len == len(self._hist):
            self._merge_history()
        self._hist[self._hist_len] = (t0, t1, vmin, vmax)
        self._hist_len += 1

    def _merge_history(self) -> None:
        n = self._hist_len - self._hist_len % 2
        h = self._hist[:n]
        merged = np.column_stack(
            (
                h[0::2, 0],
                h[1::2, 1],
                np.minimum(h[0::2, 2], h[1::2, 2]),
                np.maximum(h[0::2, 3], h[1::2, 3]),
            )
        )
        odd = self._hist[n : self._hist_len].copy()
        self._hist[: len(merged)] = merged
        self._hist[len(merged) : len(merged) + len(odd)] = odd
        self._hist_len = len(merged) + len(odd)
        self._bucket_width *= 2

    def recent(self) -> tuple[np.ndarray, np.ndarray]:
        """The recent samples at full rate, oldest first (copies)."""
        idx = (self._start + np.arange(self._len)) % len(self._t)
        return self._t[idx], self._v[idx]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Everything for drawing: history as min/max pairs, then recent samples.

        Each history bucket becomes two points at its middle time, its minimum then its
        maximum, so a line through them draws the envelope and shows every peak.
        """
        parts_t, parts_v = [], []
        hist = self._hist[: self._hist_len]
        if self._pending is not None:
            p = self._pending
            hist = np.vstack((hist, [p[0], p[1], p[2], p[3]]))
        if len(hist):
            mid = (hist[:, 0] + hist[:, 1]) / 2
            parts_t.append(np.repeat(mid, 2))
            parts_v.append(hist[:, 2:4].reshape(-1))
        rt, rv = self.recent()
        parts_t.append(rt)
        parts_v.append(rv)
        return np.concatenate(parts_t), np.concatenate(parts_v)


def append_readings(
    series: dict[str, SeriesBuffer],
    t: float,
    values: dict[str, float],
    recent: int = 6000,
    buckets: int = 2048,
) -> None:
    """Append each reading of ``values`` at ``t`` to its series, a new buffer for a key not
    seen before: how the Session and a recording's overview keep samples alike."""
    for key, value in values.items():
        buf = series.get(key)
        if buf is None:
            buf = series[key] = SeriesBuffer(recent, buckets)
        buf.append(t, value)


class StepClock:
    """Step boundaries in time, so that any time can be shown as a (fractional) step.

    Bounded too: when full it keeps every other boundary, which still interpolates well.
    """

    def __init__(self, capacity: int = 20000) -> None:
        self._t = np.empty(capacity, dtype=np.float64)
        self._s = np.empty(capacity, dtype=np.float64)
        self._len = 0
        self.steps = 0
        self.last_t = 0.0

    def add(self, t: float, step: int) -> None:
        """Record that step number ``step`` ended at time ``t``."""
        if self._len == len(self._t):
            keep = np.arange(0, self._len, 2)
            k = len(keep)
            self._t[:k] = self._t[keep]
            self._s[:k] = self._s[keep]
            self._len = k
        self._t[self._len] = t
        self._s[self._len] = step
        self._len += 1
        self.steps = step
        self.last_t = t

    def boundaries(self) -> tuple[np.ndarray, np.ndarray]:
        """Times and step numbers of the kept boundaries (copies)."""
        return self._t[: self._len].copy(), self._s[: self._len].copy()

    def to_steps(self, t: np.ndarray) -> np.ndarray:
        """Map times to steps: 0 before the first boundary, linear between boundaries."""
        if self._len == 0:
            return np.zeros_like(t)
        bt = np.concatenate(([0.0], self._t[: self._len]))
        bs = np.concatenate(([0.0], self._s[: self._len]))
        return np.interp(t, bt, bs)
