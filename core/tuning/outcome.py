"""What a batch-size search yields: each trial measured, and the result with its reasons.

Plain data shared by the search, the trial runners, the CLI, the Tune panel and
``torchmem.tune()``; :mod:`torchmem.tuning.search` makes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchmem.tuning.model import Fit
from torchmem.tuning.noise import MARGIN_SDS, BatchEffect, Noise

#: Consecutive steps with allocator retries that make a size not fit (Composer's rule):
#: the allocator freed its whole cache and retried on each, the edge of out of memory.
THRASH_STEPS = 2


class TuneError(Exception):
    """The search cannot give a recommendation; the message says why and what to do."""


class TuneCancelled(Exception):
    """The user cancelled the search."""


@dataclass
class Trial:
    """One measured batch size."""

    batch_size: int
    #: What the budget is on: the trial's peak RSS on CPU, peak reserved on accelerators.
    peak_bytes: int | None
    ok: bool
    oom: bool
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    samples_per_s: float | None = None
    steps: int = 0
    duration_s: float = 0.0
    message: str = ""
    #: Why this size was tried: ``probe``, ``verify``, ``refit``, ``bisect``, ``repeat``
    #: (the same size again, to measure the noise) or ``confirm`` (a step down from a
    #: size too close to the limit for that noise).
    role: str = "probe"
    #: What the model predicted for this size before it ran (None before any fit).
    predicted_bytes: float | None = None
    #: Module forwards with grad disabled during the trial (an evaluation pass); None
    #: where it was not counted.
    eval_forwards: int | None = None
    #: The processes of a job trial (its ranks); None for a script or a function.
    ranks: int | None = None
    #: The longest run of consecutive steps on which an accelerator's allocator freed its
    #: cache and retried, over the trial's devices (every rank's): 0 on the CPU.
    retry_steps: int = 0

    @property
    def thrashed(self) -> bool:
        """True when the allocator retried on :data:`THRASH_STEPS` consecutive steps."""
        return self.retry_steps >= THRASH_STEPS

    def fits(self, limit: float) -> bool:
        """True when the trial ran its steps, stayed at or under ``limit`` and did not
        thrash the allocator."""
        return (
            self.ok
            and not self.thrashed
            and self.peak_bytes is not None
            and self.peak_bytes <= limit
        )

    def verdict(self, limit: float) -> str:
        """``fits``, ``over the limit``, ``allocator thrash``, ``out of memory`` or
        ``failed``."""
        if self.oom:
            return "out of memory"
        if not self.ok:
            return "failed"
        if self.thrashed:
            return "allocator thrash"
        return "fits" if self.fits(limit) else "over the limit"

    def describe(self, limit: float) -> str:
        """One line for a terminal or a notebook: size, why, peak against prediction,
        verdict, throughput and time; the trial's message on a second line."""
        peak = _bytes(self.peak_bytes) if self.peak_bytes is not None else "-"
        predicted = f" (predicted {_bytes(self.predicted_bytes)})" if self.predicted_bytes else ""
        rate = f", {self.samples_per_s:,.0f} samples/s" if self.samples_per_s else ""
        verdict = self.verdict(limit)
        line = (
            f"batch {self.batch_size} ({self.role}): peak {peak}{predicted}, "
            f"{verdict.upper() if self.oom else verdict}{rate} [{self.duration_s:.1f} s]"
        )
        return line + (f"\n  {self.message}" if self.message else "")

    def to_json(self) -> dict[str, Any]:
        """As the tuning summary writes it."""
        return {
            "batch_size": self.batch_size,
            "role": self.role,
            "ok": self.ok,
            "oom": self.oom,
            "peak_bytes": self.peak_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "predicted_bytes": round(self.predicted_bytes) if self.predicted_bytes else None,
            "samples_per_s": round(self.samples_per_s, 2) if self.samples_per_s else None,
            "steps": self.steps,
            "duration_s": round(self.duration_s, 3),
            "message": self.message,
            "eval_forwards": self.eval_forwards,
            "ranks": self.ranks,
            "retry_steps": self.retry_steps,
        }


@dataclass
class TuneResult:
    """What the search found, and how."""

    #: The size to use: confirmed by repeated runs to stay under the limit with a margin
    #: for their noise. None when the batch size does not change memory (``effect``).
    recommended: int | None
    #: The largest size measured to fit (every run of it under the limit).
    max_fitting: int
    #: The final model's largest size under the limit less the noise margin, within the
    #: range: what the fit printed beside it gives (None without a fit).
    predicted: int | None
    limit_bytes: int
    fit: Fit | None
    trials: list[Trial] = field(default_factory=list)
    knee: int | None = None
    notes: list[str] = field(default_factory=list)
    #: On an accelerator, the same model fitted to peak *allocated* bytes (the fit above
    #: is on reserved, what the device must hold): the gap is the allocator's cache.
    fit_allocated: Fit | None = None
    #: The scatter of identical runs, from the sizes that ran more than once.
    noise: Noise = field(default_factory=Noise)
    #: Whether memory grows with the batch by more than that noise over the range.
    effect: BatchEffect = BatchEffect.GROWS
    #: The range searched.
    minimum: int = 1
    maximum: int = 4096
    #: How much the peak grew from the range's smallest size to its largest (mean runs;
    #: None when the largest was not run).
    growth: float | None = None

    @property
    def ooms(self) -> int:
        """Trials that ran out of memory or crossed the budget."""
        return sum(t.oom for t in self.trials)

    def explain(self, option: str = "batch size") -> list[str]:
        """The recommendation and its reasons, one sentence a line (no final stops): what
        the terminal, the Tune panel and a notebook all show."""
        count = f"{len(self.trials)} trials, {self.ooms} out of memory"
        if self.effect is BatchEffect.NONE:
            # Whether the range's top fitted is what a user asks next: a script that does
            # read the option, by a few KiB a sample, can run at that size.
            top = [t for t in self.trials if t.batch_size == self.maximum]
            fitted = (
                f"; every run of {self.maximum} stayed under the limit"
                if top and all(t.fits(self.limit_bytes) for t in top)
                else ""
            )
            lines = [
                f"no recommendation: the script does not seem to read {option} (or its "
                f"samples are too small to show): its peak changed by {_bytes(self.growth)} "
                f"from {self.minimum} to {self.maximum}, within the noise of identical runs"
                f"{fitted} ({count})"
            ]
        elif self.effect is BatchEffect.NEGLIGIBLE:
            per = self.fit.slope if self.fit is not None else 0.0
            lines = [
                f"any {option} in {self.minimum}..{self.maximum} fits: memory hardly "
                f"depends on it (about {_bytes(per)} a sample, {_bytes(self.growth)} over "
                f"the whole range, within the noise of identical runs), so choose by speed "
                f"({count})"
            ]
        else:
            lines = [
                f"recommended {option} {self.recommended} ({count}); largest measured to "
                f"fit: {self.max_fitting}"
                + (
                    f", the model's largest under the limit: {self.predicted}"
                    if self.predicted
                    else ""
                )
            ]
        if self.fit is not None and self.effect is BatchEffect.GROWS:
            lines.append(f"memory model: {self.fit.describe()}")
        if self.noise.measured:
            lines.append(
                f"noise: {self.noise.describe()}"
                + (
                    f"; the recommendation's peak stays {_bytes(self.noise.margin)} "
                    f"({MARGIN_SDS:g} sd) under the limit"
                    if self.effect is BatchEffect.GROWS and self.noise.margin > 0
                    else ""
                )
            )
        if self.fit_allocated is not None:
            lines.append(
                f"allocated alone: {self.fit_allocated.describe()} (the budget is on "
                "reserved: what the device must hold, the allocator's cache included)"
            )
        if self.knee is not None:
            lines.append(
                f"throughput knee: {self.knee} (within 5% of the best samples/s measured; "
                "larger sizes buy memory use, not speed)"
            )
        return lines + [f"note: {note}" for note in self.notes]

    def __str__(self) -> str:
        return "\n".join(self.explain())


def bytes_or_unknown(value: float | None) -> str:
    """``1.5 GiB``, or ``unknown`` for None."""
    from torchmem.units import format_bytes

    return format_bytes(value) if value is not None else "unknown"


_bytes = bytes_or_unknown
