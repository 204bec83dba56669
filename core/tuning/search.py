"""The batch-size search: few trials, a fitted model, a verified recommendation.

Finders that double until a crash need a dozen trials and several real out-of-memory
errors, recover inside an ``except`` and often hand back a size that fails later. This
search instead measures a few small sizes, fits the memory model, jumps to about a third
of the budget to fit it where it matters, predicts the largest size under the budget,
and verifies that size with a real trial. A miss beyond 5% refits and predicts again; a
trial that fails narrows the range with the model (a bisection that knows where to cut).
Every trial is a fresh process (see :mod:`torchmem.tuning.trial`), so a failure costs a
trial, never the session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchmem.tuning.model import Fit, Rounding, fit_peaks, round_batch, throughput_knee

#: Reserved growing this much faster than allocated (per sample) is worth a note.
CACHE_GROWTH = 1.25
#: A verified trial whose peak is within this share of the prediction ends the search.
VERIFY_TOLERANCE = 0.05
#: The growth probes aim at this share of the room between the smallest size's peak and
#: the limit, where the fit is made.
PROBE_SHARE = 1 / 3
#: With a fake step's model, the one probe aims here: far enough to measure its scale
#: well, and under the limit even when the real process pays 1.6x what the model says.
PRIOR_SHARE = 0.6

#: A note while the fit of the peaks has a quadratic term.
QUADRATIC_NOTE = (
    "memory grows faster than linearly with the batch size (a quadratic term fits clearly "
    "better, as with attention over long sequences)"
)


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
    #: Why this size was tried: ``probe``, ``verify``, ``refit`` or ``bisect``.
    role: str = "probe"
    #: What the model predicted for this size before it ran (None before any fit).
    predicted_bytes: float | None = None
    #: Module forwards with grad disabled during the trial (an evaluation pass); None
    #: where it was not counted.
    eval_forwards: int | None = None
    #: The processes of a job trial (its ranks); None for a script or a function.
    ranks: int | None = None

    def fits(self, limit: float) -> bool:
        """True when the trial ran its steps and stayed at or under ``limit``."""
        return self.ok and self.peak_bytes is not None and self.peak_bytes <= limit

    def verdict(self, limit: float) -> str:
        """``fits``, ``over the limit``, ``out of memory`` or ``failed``."""
        if self.oom:
            return "out of memory"
        if not self.ok:
            return "failed"
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
        }


@dataclass
class TuneResult:
    """What the search found, and how."""

    recommended: int
    #: The largest size measured under the limit (the recommendation is verified too).
    max_fitting: int
    #: The model's first prediction for the limit, before any verification.
    predicted: int | None
    limit_bytes: int
    fit: Fit | None
    trials: list[Trial] = field(default_factory=list)
    knee: int | None = None
    notes: list[str] = field(default_factory=list)
    #: On an accelerator, the same model fitted to peak *allocated* bytes (the fit above
    #: is on reserved, what the device must hold): the gap is the allocator's cache.
    fit_allocated: Fit | None = None

    @property
    def ooms(self) -> int:
        """Trials that ran out of memory or crossed the budget."""
        return sum(t.oom for t in self.trials)

    def explain(self, option: str = "batch size") -> list[str]:
        """The recommendation and its reasons, one sentence a line (no final stops): what
        the terminal, the Tune panel and a notebook all show."""
        lines = [
            f"recommended {option} {self.recommended} ({len(self.trials)} trials, "
            f"{self.ooms} out of memory); largest measured to fit: {self.max_fitting}"
            + (f", model's prediction: {self.predicted}" if self.predicted else "")
        ]
        if self.fit is not None:
            lines.append(f"memory model: {self.fit.describe()}")
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


Measure = Callable[[int, str, "float | None"], Trial]


class BatchSearch:
    """Finds the largest batch size whose peak stays under ``limit_bytes``.

    ``measure(batch_size, role, predicted_bytes)`` runs one trial. ``on_trial(trial,
    fit)`` hears of each one as it ends (for a live plot), ``cancel`` stops the search
    before the next trial.
    """

    def __init__(
        self,
        measure: Measure,
        limit_bytes: float,
        minimum: int = 1,
        maximum: int = 4096,
        rounding: Rounding = "none",
        max_trials: int = 10,
        on_trial: Callable[[Trial, Fit | None], None] | None = None,
        cancel: threading.Event | None = None,
        prior: Fit | None = None,
    ) -> None:
        if minimum < 1 or maximum < minimum:
            raise TuneError(f"the range must be 1 <= min <= max, not {minimum}..{maximum}")
        if limit_bytes <= 0:
            raise TuneError("the memory limit (budget minus headroom) must be positive")
        self.measure = measure
        self.limit = float(limit_bytes)
        self.minimum, self.maximum = minimum, maximum
        self.rounding: Rounding = rounding
        self.max_trials = max_trials
        self.on_trial = on_trial
        self.cancel = cancel or threading.Event()
        self.trials: list[Trial] = []
        self.fit: Fit | None = None
        self.notes: list[str] = []
        #: Peak tensor bytes per batch size from a fake step (:mod:`.predict`), before
        #: any trial: the search anchors it on the first trial and goes straight to its
        #: prediction, instead of probing for a slope.
        self.prior = prior

    # -- the state of the search -------------------------------------------------------------
    @property
    def good(self) -> int | None:
        """The largest size that fitted so far."""
        sizes = [t.batch_size for t in self.trials if t.fits(self.limit)]
        return max(sizes) if sizes else None

    @property
    def failed(self) -> int | None:
        """The smallest size that did not fit (or crossed the limit) so far."""
        sizes = [
            t.batch_size
            for t in self.trials
            if (t.oom or (t.ok and t.peak_bytes is not None and t.peak_bytes > self.limit))
        ]
        return min(sizes) if sizes else None

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

    def _run(self, batch: int, role: str) -> Trial:
        if self.cancel.is_set():
            raise TuneCancelled()
        if len(self.trials) >= self.max_trials:
            raise _OutOfTrials()
        predicted = self.fit.peak(batch) if self.fit is not None else None
        trial = self.measure(batch, role, predicted)
        trial.role = role
        trial.predicted_bytes = predicted
        self.trials.append(trial)
        if trial.ok and not trial.oom:
            self._refit()
        if self.on_trial is not None:
            self.on_trial(trial, self.fit)
        if self.cancel.is_set():
            raise TuneCancelled()
        return trial

    # -- the search ---------------------------------------------------------------------------
    def run(self) -> TuneResult:
        """Search, and return the verified recommendation; TuneError when nothing fits."""
        predicted: int | None = None
        try:
            first = self._run(self.minimum, "probe")
            if not first.ok and not first.oom:
                raise TuneError(f"the trial at batch size {self.minimum} failed: {first.message}")
            if not first.fits(self.limit):
                raise TuneError(
                    f"batch size {self.minimum} does not fit: its peak "
                    f"({_bytes(first.peak_bytes)}) is over the limit {_bytes(self.limit)}. "
                    "Raise the budget, lower the headroom, or shrink the model."
                )
            if self.prior is None:
                self._grow()
            else:
                self._scale()
            predicted = self._predict()
            self._verify(predicted)
        except _OutOfTrials:
            self._note(f"stopped after {self.max_trials} trials (--max-trials)")
        good = self.good
        assert good is not None  # the first trial fitted
        recommended = round_batch(good, self.rounding, self.minimum)
        if recommended not in {t.batch_size for t in self.trials if t.fits(self.limit)}:
            # Rounding down from a verified size keeps it under the limit (memory grows
            # with the batch), but say that this exact size was not run.
            self._note(f"{recommended} is {good} rounded down ({self.rounding})")
        rates = {
            t.batch_size: t.samples_per_s
            for t in self.trials
            if t.fits(self.limit) and t.samples_per_s
        }
        fit_allocated = self._fit_allocated()
        self._note_coverage()
        return TuneResult(
            fit_allocated=fit_allocated,
            recommended=recommended,
            max_fitting=good,
            predicted=predicted,
            limit_bytes=int(self.limit),
            fit=self.fit,
            trials=list(self.trials),
            knee=throughput_knee(rates),
            notes=list(self.notes),
        )

    def _grow(self) -> None:
        """Probe bigger sizes until the part of the peak that grows with the batch fills
        about a third of the room above the smallest size's peak (and at least two sizes,
        so that there is a slope). The fit is then made where the prediction is:
        extrapolating three times further, not a hundred."""
        base = self.trials[0].peak_bytes or 0
        target = base + (self.limit - base) * PROBE_SHARE
        # "About" a third: four fifths of it will do (one more probe would cost a trial).
        enough = base + (self.limit - base) * PROBE_SHARE * 0.8
        last = self.trials[-1]
        while (
            last.fits(self.limit)
            and (last.peak_bytes < enough or self.fit is None)
            and last.batch_size < self.maximum
        ):
            b = last.batch_size
            if self.fit is None or self.fit.slope <= 0:
                nxt = b * 2 if len(self.trials) < 2 else b * 8
            else:
                aim = self.fit.largest_under(target)
                nxt = int(aim) if aim is not None else b * 8
                # While the growing part is lost in the noise of the fixed part, the slope
                # is a guess: jump up to 16x to get out of the noise. Once it shows, at most
                # 8x: memory may grow faster than the line (attention), which the fit can
                # only see from four sizes on.
                cap = 16 if (last.peak_bytes - base) < 0.1 * base else 8
                nxt = max(b * 2, min(nxt, b * cap))
            nxt = min(max(nxt, b + 1), self.maximum)
            last = self._run(nxt, "probe")
            if not last.ok and not last.oom:
                raise TuneError(f"the trial at batch size {nxt} failed: {last.message}")

    def _scale(self) -> None:
        """One trial where the fake step's model, on the first trial, fills
        :data:`PRIOR_SHARE` of the room: what the real process pays per tensor byte (RSS
        over tensors on CPU, the allocator's rounding on a device; 1.0 to 1.5 in
        practice) sets the scale before the prediction goes near the limit."""
        first = self.trials[0]
        if self.fit is None or first.peak_bytes is None:
            return
        base = first.peak_bytes
        aim = self.fit.largest_under(base + (self.limit - base) * PRIOR_SHARE)
        if aim is None:
            return
        size = min(int(aim), self.maximum)
        if size <= first.batch_size * (1 + VERIFY_TOLERANCE):
            return  # too close to the first trial to learn a scale from
        trial = self._run(size, "probe")
        if not trial.ok and not trial.oom:
            raise TuneError(f"the trial at batch size {size} failed: {trial.message}")

    def _predict(self) -> int:
        """The model's largest size under the limit, within the range and below a failure."""
        fit = self.fit
        good = self.good or self.minimum
        # Aim a little under the limit, by the fit's own scatter (1-3%): a prediction that
        # lands just over it costs another trial, one just under costs 1% of the size.
        margin = (
            min(max(2 * fit.rms_residual, 0.01 * self.limit), 0.03 * self.limit)
            if fit is not None
            else 0.0
        )
        aim = fit.largest_under(self.limit - margin) if fit is not None else None
        if aim is None:
            self._note(
                "peak memory did not grow with the batch size in these trials: the "
                "maximum of the range is tried"
            )
            aim = self.maximum
        upper = self.failed
        ceiling = min(self.maximum, upper - 1 if upper is not None else self.maximum)
        return max(good, min(int(aim), ceiling))

    def _verify(self, batch: int) -> None:
        """Run the predicted size; refit and predict again on a miss. Once a size failed
        where the model said it would fit, the model is wrong up there (an eval pass,
        fragmentation): bisect between the last good size and the failed one until they
        are within 5% of each other."""
        tried: set[int] = set()
        if self.failed is not None:  # a growth probe already failed: cut below it
            batch = self._between(self.good or self.minimum, self.failed)
        while True:
            batch = round_batch(batch, self.rounding, self.minimum)
            good = self.good or self.minimum
            if batch <= good or batch in tried:
                return
            tried.add(batch)
            # A second look is a cut after a failure, a refitted guess after a miss.
            again = "bisect" if self.failed is not None else "refit"
            trial = self._run(batch, "verify" if len(tried) == 1 else again)
            if not trial.ok and not trial.oom:
                raise TuneError(f"the trial at batch size {batch} failed: {trial.message}")
            failed = self.failed
            good = self.good or self.minimum
            if failed is not None:
                if failed - good <= max(1, VERIFY_TOLERANCE * good):
                    return
                batch = self._between(good, failed)
                continue
            expected = trial.predicted_bytes
            close = expected and abs(trial.peak_bytes - expected) <= VERIFY_TOLERANCE * expected
            if close or batch >= self.maximum:
                return
            batch = self._predict()  # refitted with this trial: closer now
            if batch <= good * (1 + VERIFY_TOLERANCE):
                return  # the refitted model agrees to within 5%: no trial would gain more

    def _between(self, good: int, failed: int) -> int:
        """Where to cut between a size that fitted and one that did not: where the line
        through their measured peaks meets the limit (when both peaks are known), else
        where the model says, unless the model had said the failed size would fit (it is
        wrong up there: a device smaller than the budget, an eval pass): then halfway."""
        by_size = {t.batch_size: t for t in self.trials}
        low, high = by_size[good].peak_bytes, by_size[failed].peak_bytes
        said = by_size[failed].predicted_bytes
        if low is not None and high is not None and high > low:
            aim = good + (self.limit - low) / (high - low) * (failed - good)
        elif said is None or said > self.limit:
            aim = self._predict()
        else:
            aim = (good + failed) / 2
        if not good < aim < failed:
            aim = (good + failed) / 2
        # A little short of the line: the next trial should fit, and close the gap.
        return max(good + 1, int(good + 0.97 * (aim - good)))


class _OutOfTrials(Exception):
    pass


def _bytes(value: float | None) -> str:
    from torchmem.units import format_bytes

    return format_bytes(value) if value is not None else "unknown"
