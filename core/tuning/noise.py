"""How much identical trials differ: the noise a batch-size search must stay clear of.

Two runs of one script at one batch size do not peak at the same memory. On CPU, glibc's
heap keeps a freed 16 MiB tensor resident or hands it back depending on timing, so the
peak RSS of an MLP with Adam moved between 665 and 713 MiB over five identical runs at
batch 1, and between 765 and 841 MiB at batch 1576. A size read off one lucky run fails
the next. The search therefore repeats the runs its decisions hinge on, pools their
scatter into one standard deviation (the scatter hardly depends on the batch size: it is
the allocator's, not the batch's), and keeps its recommendation :data:`MARGIN_SDS` of
them under the limit. The same figures tell when the batch hardly matters: when all it
adds over the whole range is within that noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

#: A recommendation's mean peak stays this many standard deviations of identical runs
#: under the limit: about 2 in 100 single runs would cross the limit, and the headroom
#: between the limit and the budget takes those.
MARGIN_SDS = 2.0


@dataclass(frozen=True)
class Noise:
    """The scatter of identical trials: pooled over every size that ran more than once,
    and, once those disagree, the scatter of every trial about the fitted model too."""

    #: Pooled standard deviation of identical runs' peaks, in bytes.
    sd: float = 0.0
    #: The largest difference between two runs of one size, in bytes.
    spread: float = 0.0
    #: Degrees of freedom behind ``sd`` (runs minus sizes repeated); 0: not measured.
    dof: int = 0
    #: Runs that belong to a repeated size.
    runs: int = 0
    #: The standard deviation of all trials about the fit (its residuals, per degree of
    #: freedom), counted only when identical runs were seen to differ: then the fit's
    #: residuals are that noise, with more runs behind them than the repeats alone.
    fit_sd: float = 0.0
    #: Degrees of freedom behind ``fit_sd`` (runs minus the fit's terms).
    fit_dof: int = 0

    @property
    def measured(self) -> bool:
        """True once some size ran at least twice."""
        return self.dof > 0

    @property
    def sigma(self) -> float:
        """The standard deviation the search plans with: the repeats' and the fit's
        variances pooled by their degrees of freedom.

        Not the larger of the two: two pairs of repeats that each drew 0 and 3 heap
        chunks read sd 68 MiB where it is 36, and a margin of twice that refused batch 1
        (588 MiB on average, under a 720 MiB limit) or recommended 1 in 2 of 100
        simulated tunings of issue 30's MLP. The fit's residuals stand on every run."""
        if self.fit_sd <= 0 or self.fit_dof <= 0:
            return self.sd
        variance = self.dof * self.sd**2 + self.fit_dof * self.fit_sd**2
        return math.sqrt(variance / (self.dof + self.fit_dof))

    @property
    def margin(self) -> float:
        """How far under the limit a recommendation's mean peak stays."""
        return MARGIN_SDS * self.sigma

    def describe(self) -> str:
        """``identical runs differ by up to 48 MiB (sd 19.5 MiB, 6 runs at 2 sizes)``."""
        from torchmem.units import format_bytes

        if not self.measured:
            return "no size was run twice: the noise of identical runs is not known"
        sizes = self.runs - self.dof
        return (
            f"identical runs differ by up to {format_bytes(self.spread)} (sd "
            f"{format_bytes(self.sigma)}, {self.runs} runs at {sizes} size{'s' * (sizes > 1)})"
        )

    def to_json(self) -> dict[str, float | int]:
        """As the tuning summary writes it (``noise``)."""
        return {
            "sd_bytes": round(self.sigma),
            "spread_bytes": round(self.spread),
            "margin_bytes": round(self.margin),
            "dof": self.dof,
            "runs": self.runs,
        }


def measure_noise(
    runs: Iterable[tuple[int, float]],
    fit_sd: float = 0.0,
    visible: float = 0.0,
    fit_dof: int = 0,
) -> Noise:
    """The noise of ``(batch size, peak)`` runs (sizes run once say nothing of it). The
    ``fit_sd`` of every run about the model joins in once two identical runs differ by
    more than ``visible`` bytes, or it is itself over ``5 * visible``: a model that is
    merely not a line (the allocator's block sizes) does not count as noise while its
    repeats agree, but two runs that drew the same number of 16 MiB blocks from glibc
    do not hide a scatter that every other run shows. ``fit_dof``: the degrees of
    freedom behind ``fit_sd`` (see :attr:`Noise.sigma`)."""
    by_size: dict[int, list[float]] = {}
    for batch, peak in runs:
        by_size.setdefault(batch, []).append(float(peak))
    groups = [peaks for peaks in by_size.values() if len(peaks) > 1]
    if not groups:
        return Noise()
    squares = sum(sum((p - sum(g) / len(g)) ** 2 for p in g) for g in groups)
    dof = sum(len(g) - 1 for g in groups)
    spread = max(max(g) - min(g) for g in groups)
    counted = spread > visible or fit_sd > 5 * visible
    return Noise(
        sd=math.sqrt(squares / dof),
        spread=spread,
        dof=dof,
        runs=sum(len(g) for g in groups),
        fit_sd=fit_sd if counted else 0.0,
        fit_dof=fit_dof if counted else 0,
    )


class BatchEffect(str, Enum):
    """How much the batch size moves the peak over the searched range."""

    GROWS = "grows"  # memory limits the batch size: the recommendation is a real answer
    NEGLIGIBLE = "negligible"  # it grows, but less over the whole range than the noise
    NONE = "none"  # no growth the runs can tell from noise: the option seems unread


def batch_effect(growth: float, growth_sd: float, noise: Noise, read: bool = False) -> BatchEffect:
    """Judge ``growth``, the peak's rise over the searched range read off a line through
    every run (``growth_sd``: its standard error): none while it is not three standard
    errors above zero, negligible while it is within the noise of identical runs.

    ``read``: a fake step saw the batch's tensors grow, so the script reads the option and
    a rise the runs cannot show is small, not absent (issue 30's MLP: 44 KiB a sample,
    94-119 MiB over 1..4096 where identical runs differ by 46 MiB sd)."""
    if growth <= 3 * growth_sd:
        return BatchEffect.NEGLIGIBLE if read else BatchEffect.NONE
    if growth <= max(noise.margin, noise.spread):
        return BatchEffect.NEGLIGIBLE
    return BatchEffect.GROWS
