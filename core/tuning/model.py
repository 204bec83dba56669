"""The memory model of a batch-size search: peak bytes as a function of the batch size.

Training memory is, to a good approximation, a fixed part (parameters, gradients,
optimizer state, the framework) plus a part per sample (activations); attention over a
sequence adds a quadratic term. The search measures a few sizes, fits ``peak = a + s*b``
by least squares, and takes a quadratic term only when it clearly fits better (and says
so). The fit then predicts the largest size under a budget.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Rounding = Literal["none", "multiple8", "pow2"]

#: A quadratic term is used only when it cuts the residuals of the line by this factor.
QUADRATIC_GAIN = 4.0


@dataclass(frozen=True)
class Fit:
    """``peak(b) = intercept + slope*b + quadratic*b²`` fitted to measured trials."""

    intercept: float
    slope: float
    quadratic: float = 0.0
    #: Root-mean-square residual of the fit, in bytes (0 with as many points as terms).
    rms_residual: float = 0.0
    points: int = 0

    @property
    def is_quadratic(self) -> bool:
        """True when the quadratic term was kept."""
        return self.quadratic != 0.0

    def peak(self, batch: float) -> float:
        """Predicted peak bytes at ``batch``."""
        return self.intercept + self.slope * batch + self.quadratic * batch * batch

    def largest_under(self, limit: float) -> float | None:
        """The (fractional) batch size whose predicted peak is ``limit``; None when the
        model does not grow with the batch (no size is limited by memory)."""
        a, s, q = self.intercept - limit, self.slope, self.quadratic
        if q > 0:
            disc = s * s - 4 * q * a
            return (-s + math.sqrt(disc)) / (2 * q) if disc >= 0 else None
        if s <= 0:
            return None
        return -a / s

    def describe(self) -> str:
        """``peak ≈ 1.2 GiB + 3.4 MiB x batch`` (and the quadratic term if any)."""
        from torchmem.units import format_bytes

        text = f"peak ≈ {format_bytes(self.intercept)} + {format_bytes(self.slope)} × batch"
        if self.is_quadratic:
            text += f" + {format_bytes(self.quadratic)} × batch²"
        return text

    def to_json(self) -> dict[str, float | int | None]:
        """As a tuning summary writes it."""
        return {
            "intercept": round(self.intercept),
            "slope": round(self.slope, 3),
            "quadratic": round(self.quadratic, 6) if self.is_quadratic else None,
            "rms_residual": round(self.rms_residual),
            "points": self.points,
        }


def fit_peaks(batches: list[float], peaks: list[float], allow_quadratic: bool = True) -> Fit:
    """Least-squares fit of ``peaks`` over ``batches`` (at least two distinct sizes).

    The quadratic term is tried with four or more sizes, and kept when it is positive and
    cuts the line's residuals by :data:`QUADRATIC_GAIN` (noise alone does not do that).
    """
    x = np.asarray(batches, dtype=float)
    y = np.asarray(peaks, dtype=float)
    if len(set(x.tolist())) < 2:
        raise ValueError("a fit needs at least two different batch sizes")
    line, line_rms = _lstsq(x, y, degree=1)
    best = Fit(line[0], line[1], 0.0, line_rms, len(x))
    if allow_quadratic and len(set(x.tolist())) >= 4:
        quad, quad_rms = _lstsq(x, y, degree=2)
        if quad[2] > 0 and quad_rms * QUADRATIC_GAIN < line_rms:
            best = Fit(quad[0], quad[1], quad[2], quad_rms, len(x))
    return best


#: A fake step's peaks grow as a square when their top three slopes (between neighbouring
#: sizes) lie on one line in the sizes, to this share of how much the slopes changed.
SQUARE_TOLERANCE = 0.01


def fit_exact(points: list[tuple[int, int]]) -> Fit:
    """The model of a fake step's peaks (exact: no noise) at the top of their range, where
    the answer lies (the fake steps stop at the first size past the limit).

    A step's peak is the largest of its moments' tensor bytes, each a line in the batch
    (plus a square where a tensor is batch by batch, as in a contrastive loss), so the
    peaks bend upward wherever the peak moves from one moment to another. The MLP of issue
    30 grows 16, 33, then 48 KiB a sample as its peak moves from the optimizer's step to
    the backward. A least-squares fit over the whole range read those bends as a square,
    said "memory grows faster than linearly" of an MLP, and overstated every larger size.

    Between sizes ``b`` and ``c`` a square ``q·b²`` has the slope ``s + q·(b + c)``: the
    slopes lie on one line. Where the top three do (the MLP's miss it by 3% of their
    change, a square by 0.3%), the model is the parabola through the top three points.
    Otherwise it is the chord of the top two, exact at both and never under the peaks
    between them; below them its slope is the steepest, so growth from a real trial at a
    smaller size is overstated, never understated.
    """
    pts = sorted(dict(points).items())
    if len(pts) >= 4:
        pairs = list(itertools.pairwise(pts[-4:]))
        slopes = [(p2 - p1) / (b2 - b1) for (b1, p1), (b2, p2) in pairs]
        x = [b1 + b2 for (b1, _), (b2, _) in pairs]
        quadratic = (slopes[2] - slopes[1]) / (x[2] - x[1])
        slope = slopes[2] - quadratic * x[2]
        change = slopes[2] - slopes[0]
        if quadratic > 0 and abs(slope + quadratic * x[0] - slopes[0]) <= SQUARE_TOLERANCE * change:
            b, p = pts[-1]
            return Fit(p - slope * b - quadratic * b * b, slope, quadratic, 0.0, len(pts))
    (b1, p1), (b2, p2) = pts[-2:]
    slope = (p2 - p1) / (b2 - b1)
    return Fit(p2 - slope * b2, slope, 0.0, 0.0, len(pts))


def _lstsq(x: np.ndarray, y: np.ndarray, degree: int) -> tuple[list[float], float]:
    # Columns scaled to unit size: batch² of 4096 next to 1 would make the system
    # ill-conditioned.
    scale = max(float(np.max(np.abs(x))), 1.0)
    design = np.vander(x / scale, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    rms = float(np.sqrt(np.mean(residual**2)))
    return [float(c) / scale**i for i, c in enumerate(coef)], rms


def round_batch(batch: float, rounding: Rounding, minimum: int = 1) -> int:
    """The largest size at or below ``batch`` that ``rounding`` allows (never below
    ``minimum``): a multiple of 8 (from 8 on), a power of two, or any integer."""
    b = max(int(math.floor(batch)), minimum)
    if rounding == "multiple8" and b >= 8:
        return max(b - b % 8, minimum)
    if rounding == "pow2":
        return max(1 << (b.bit_length() - 1), minimum)
    return b


def throughput_knee(rates: dict[int, float], within: float = 0.05) -> int | None:
    """The smallest batch size whose samples/s is within ``within`` of the best measured:
    beyond it a bigger batch buys memory use, not speed."""
    if not rates:
        return None
    best = max(rates.values())
    return min(b for b, r in rates.items() if r >= (1 - within) * best)
