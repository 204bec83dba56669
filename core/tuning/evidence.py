"""What a batch-size search's trials say so far: peaks, failures, noise and the model.

:class:`~torchmem.tuning.search.BatchSearch` decides which size to try next; this is
the record it decides from: the trials, the smallest size that failed and the largest
that fitted, the scatter of identical runs, the fitted model of peak memory (anchored
on a fake step's prediction while there are too few sizes of its own), whether the
batch moves memory by more than that scatter at all, and the notes the search hands back
with its answer.
"""

from __future__ import annotations

import math

import numpy as np

from torchmem.tuning.model import Fit, fit_peaks
from torchmem.tuning.noise import BatchEffect, Noise, batch_effect, measure_noise
from torchmem.tuning.outcome import Trial

#: Reserved growing this much faster than allocated (per sample) is worth a note.
CACHE_GROWTH = 1.25
#: A note while the fit of the peaks has a quadratic term. It names no cause: the fit
#: cannot tell attention from a contrastive loss's batch-by-batch matrix.
QUADRATIC_NOTE = (
    "memory grows faster than linearly with the batch size (a quadratic term fits clearly "
    "better than a line)"
)


class Evidence:
    """The trials of one search and what they say about sizes under ``limit_bytes``."""

    def __init__(self, limit_bytes: float, prior: Fit | None = None) -> None:
        self.limit = float(limit_bytes)
        self.trials: list[Trial] = []
        self.fit: Fit | None = None
        self.notes: list[str] = []
        #: Peak tensor bytes per batch size from a fake step (:mod:`.predict`), before
        #: any trial: the search anchors it on the first trial and goes straight to its
        #: prediction, instead of probing for a slope.
        self.prior = prior

    def _peaks(self, batch: int) -> list[float]:
        """The peaks of ``batch``'s runs that ended well."""
        return [
            float(t.peak_bytes)
            for t in self.trials
            if t.batch_size == batch and t.ok and t.peak_bytes is not None
        ]

    def _runs(self) -> list[tuple[int, float]]:
        """``(batch size, peak)`` of every run that ended well and within the limit's
        reach (no out-of-memory error): what the noise and the batch's effect are read
        from."""
        return [
            (t.batch_size, float(t.peak_bytes))
            for t in self.trials
            if t.ok and not t.oom and t.peak_bytes is not None
        ]

    @property
    def failed(self) -> int | None:
        """The smallest size that did not fit (crossed the limit, or thrashed the
        allocator) in some run so far."""
        sizes = [
            t.batch_size
            for t in self.trials
            if t.oom
            or t.thrashed
            or (t.ok and t.peak_bytes is not None and t.peak_bytes > self.limit)
        ]
        return min(sizes) if sizes else None

    @property
    def good(self) -> int | None:
        """The largest size below every failure whose runs all fitted so far."""
        failed = self.failed
        sizes = {
            t.batch_size
            for t in self.trials
            if t.fits(self.limit) and (failed is None or t.batch_size < failed)
        }
        return max(sizes) if sizes else None

    def _fit_dof(self) -> int:
        """The degrees of freedom of the runs about the fit (0 below two)."""
        fit = self.fit
        if fit is None:
            return 0
        dof = fit.points - (3 if fit.is_quadratic else 2)
        return dof if dof >= 2 else 0

    def _fit_sd(self) -> float:
        """The standard deviation of the runs about the fit (0 below two degrees of
        freedom)."""
        dof = self._fit_dof()
        if self.fit is None or not dof:
            return 0.0
        return self.fit.rms_residual * math.sqrt(self.fit.points / dof)

    @property
    def noise(self) -> Noise:
        """The scatter of identical runs measured so far (with the fit's residuals once
        they disagree at all)."""
        return measure_noise(
            self._runs(),
            fit_sd=self._fit_sd(),
            visible=0.001 * self.limit,
            fit_dof=self._fit_dof(),
        )

    def effect(
        self, minimum: int, maximum: int, resolution: float
    ) -> tuple[BatchEffect, float | None]:
        """Whether the batch moves memory by more than the noise over the range
        ``minimum``..``maximum``, and by how much: read off a line through every run, once
        the range's top was run. ``resolution`` is the measure's step (a rise under it is
        none, whatever its standard error says)."""
        runs = self._runs()
        sizes = np.array([b for b, _ in runs], dtype=float)
        if maximum not in sizes or len(set(sizes.tolist())) < 2 or len(runs) < 3:
            return BatchEffect.GROWS, None
        peaks = np.array([p for _, p in runs])
        slope, intercept = np.polyfit(sizes, peaks, 1)
        residual_sd = float(
            np.sqrt(np.sum((peaks - intercept - slope * sizes) ** 2) / (len(runs) - 2))
        )
        sigma = max(self.noise.sigma, residual_sd)
        spread = float(np.sqrt(np.sum((sizes - sizes.mean()) ** 2)))
        span = maximum - minimum
        growth = float(slope) * span
        growth_sd = max(sigma / spread * span, resolution / 3)
        read = self.prior is not None and self.prior.slope > 0
        return batch_effect(growth, growth_sd, self.noise, read), growth

    def _level(self, batch: int) -> float:
        """The mean peak to judge ``batch`` by: its runs' mean; while runs are noisy and
        the fit stands on more runs than ``batch`` has, the fit there (one run of a size
        sits up to two sd off its mean, either way; the fit averages every run)."""
        peaks = self._peaks(batch)
        mean = sum(peaks) / len(peaks)
        fit = self.fit
        if self.noise.sigma > 0 and fit is not None and self._fit_sd() > 0:
            return fit.peak(batch)
        return mean

    def _accepted(self, batch: int) -> bool:
        """True when every run of ``batch`` fitted and their mean stays the noise margin
        under the limit: the next run of it will fit too."""
        failed = self.failed
        peaks = self._peaks(batch)
        runs = [t for t in self.trials if t.batch_size == batch]
        return (
            bool(peaks)
            and all(t.fits(self.limit) for t in runs)
            and (failed is None or batch < failed)
            and self._level(batch) + self.noise.margin <= self.limit
        )

    def _refit(self) -> Fit | None:
        points = [(t.batch_size, t.peak_bytes) for t in self.trials if t.ok and t.peak_bytes]
        sizes = len({b for b, _ in points})
        if self.prior is not None and 1 <= sizes < 4:
            # Too few real sizes for a fit of their own: the fake step's shape, moved onto
            # them (one trial) or scaled through them (two or three).
            from torchmem.tuning.predict import anchored, scaled

            b, p = points[0]
            fit = anchored(self.prior, b, p) if sizes == 1 else scaled(self.prior, points)
        elif sizes < 2:
            return None
        else:
            fit = fit_peaks([b for b, _ in points], [p for _, p in points])
        # Said of the fit the answer comes from: a quadratic term that an early fit took
        # from a few noisy peaks and a later one dropped was still "said" on an H200.
        if fit.is_quadratic:
            self._note(QUADRATIC_NOTE)
        elif QUADRATIC_NOTE in self.notes:
            self.notes.remove(QUADRATIC_NOTE)
        self.fit = fit
        return fit

    def _note_coverage(self) -> None:
        """Say whether the trials' peaks include an evaluation pass."""
        counted = [t.eval_forwards for t in self.trials if t.ok and t.eval_forwards is not None]
        if not counted:
            return
        if all(counted):
            self._note(
                "every trial included an evaluation pass (forwards without grad): its "
                "memory is in the peaks"
            )
        elif not any(counted):
            self._note(
                f"no trial reached an evaluation pass in its {self.trials[0].steps} steps: "
                "if the script evaluates later (each epoch), raise --steps to cover it, or "
                "check evaluation on its own (a larger eval batch can need more memory)"
            )

    def _fit_allocated(self) -> Fit | None:
        """The model of peak allocated bytes (accelerators), fitted apart from reserved
        (yolov5 #9287: a cache that grows with the batch skews a single fit); a note when
        reserved grows clearly faster than allocated."""
        points = [
            (t.batch_size, t.peak_allocated_bytes)
            for t in self.trials
            if t.ok and t.peak_allocated_bytes is not None
        ]
        if len({b for b, _ in points}) < 2:
            return None
        fit = fit_peaks([b for b, _ in points], [p for _, p in points], allow_quadratic=False)
        if self.fit is not None and fit.slope > 0:
            ratio = self.fit.slope / fit.slope
            if ratio > CACHE_GROWTH:
                self._note(
                    f"reserved memory grows {ratio:.2f}x as fast as allocated memory with "
                    "the batch: the allocator's cache fragments (try "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, Run > Allocator "
                    "settings); the budget stays on reserved, which is what runs out"
                )
        return fit

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
