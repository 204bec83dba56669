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

import math
import threading
from collections.abc import Callable

import numpy as np

from torchmem.tuning.evidence import Evidence
from torchmem.tuning.model import Fit, Rounding, round_batch, throughput_knee
from torchmem.tuning.noise import MARGIN_SDS, BatchEffect
from torchmem.tuning.outcome import Trial, TuneCancelled, TuneError, TuneResult
from torchmem.tuning.outcome import bytes_or_unknown as _bytes

# The search's outcome types are imported from here by callers too.
__all__ = [
    "BatchSearch", "Trial", "TuneCancelled", "TuneError", "TuneResult", "prior_share",
    "resolution",
]  # fmt: skip

#: A verified trial whose peak is within this share of the prediction ends the search.
VERIFY_TOLERANCE = 0.05
#: The growth probes aim at this share of the room between the smallest size's peak and
#: the limit, where the fit is made.
PROBE_SHARE = 1 / 3
#: With a fake step's model, the one probe aims here: far enough to measure its scale
#: well, and under the limit even when the real process pays 1.6x what the model says
#: (an accelerator's allocator: 1.0 to 1.5 in practice).
PRIOR_SHARE = 0.6
#: The same on CPU, where peak RSS grows 2 to 6 times as fast as the fake step's tensor
#: bytes (an MLP with Adam: 78 KiB a sample against 13 KiB; glibc keeps freed chunks
#: and oneDNN its scratch buffers): a probe at 0.6 crossed the budget.
PRIOR_SHARE_CPU = 0.2
#: The prediction aims this share of the limit under it (more where the fit scatters):
#: before any repeat the noise is unknown. Once repeats show it smaller, the answer may
#: move up by this much; a confirming trial is not worth that little.
PREDICT_MARGIN = 0.02
#: A size the model picks above the accepted answer is run to confirm it only when its
#: peak is higher by more than this share of the limit: more than the margin the
#: prediction kept (the model was off, not merely cautious). At the margin itself, a
#: prediction that was right sat on the edge, and a refit's slope decided by a few
#: bytes whether a fifth trial ran (1, 50, 236, 236, then 249, for 5% more batch).
CONFIRM_GAIN = 1.5 * PREDICT_MARGIN


def prior_share(device: str) -> float:
    """Where the one probe after a fake step aims, as a share of the room, on ``device``."""
    return PRIOR_SHARE_CPU if device == "cpu" else PRIOR_SHARE


#: The smallest rise of peak RSS over the range that tells a batch that adds memory from
#: one that does not. Identical runs of a script that never read its batch option peaked
#: at 320 or 326 MiB, two runs of each size agreeing to 0.2 MiB: two sizes that drew
#: different modes read as growth, three standard errors of it.
RSS_RESOLUTION = 8 << 20
#: The same where the fake steps saw the batch's tensors stay flat: a rise must then be
#: more than one chunk of glibc's heap (32 MiB, the unit issue 30's MLP drew 0 to 3 of
#: at random) to be the batch's. A clean-clone CI run of that script read "grows": both
#: runs of the top size drew the high mode, every smaller size the low one, 12 MiB
#: apart. Memory a script ties to the batch outside tensors (decoded images, numpy
#: buffers) is far more than a chunk at the top of a range.
FLAT_RSS_RESOLUTION = 32 << 20


def resolution(device: str, flat: bool = False) -> float:
    """The measure's resolution on ``device``: :data:`RSS_RESOLUTION` on CPU
    (:data:`FLAT_RSS_RESOLUTION` where the fake steps were ``flat``); none on an
    accelerator, whose allocator counts bytes exactly."""
    if device != "cpu":
        return 0.0
    return float(FLAT_RSS_RESOLUTION if flat else RSS_RESOLUTION)


#: Two runs of one size whose difference, doubled, is under this share of the room above
#: the smallest size's peak agree well enough: the noise moves the answer by under 5%,
#: and a third run would not change it.
AGREE = 0.05
#: Where identical runs differ, the size nearest the limit is repeated until the answer's
#: standard error is under this share of it (three tunings then agree within 10%), while
#: trials are left.
PRECISION = 0.03
#: No size is refused as unreliable on a noise measured with fewer degrees of freedom
#: than this, while the smallest size's runs all fit (its sd is then known to ~30%).
REFUSAL_DOF = 6
#: When the batch adds less than this share of the first size's peak over the probes,
#: the first size's own noise matters: it is run again.
SMALL_GROWTH = 0.1
#: A growth probe never jumps past where the steepest slope the runs allow (their rise
#: plus the noise, over the sizes between) fills this share of the room: a 16x jump out
#: of the noise from 32 landed at 512, twice the limit, and the bisection back cost two
#: trials over the limit and often five more.
LEAP_SHARE = 2 / 3

Measure = Callable[[int, str, "float | None"], Trial]


class BatchSearch(Evidence):
    """Finds the largest batch size whose peak stays under ``limit_bytes``: which trial
    to run next (what the trials so far say is :class:`Evidence`'s).

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
        max_trials: int = 12,
        on_trial: Callable[[Trial, Fit | None], None] | None = None,
        cancel: threading.Event | None = None,
        prior: Fit | None = None,
        prior_share: float = PRIOR_SHARE,
        resolution: float = 0.0,
    ) -> None:
        if minimum < 1 or maximum < minimum:
            raise TuneError(f"the range must be 1 <= min <= max, not {minimum}..{maximum}")
        if limit_bytes <= 0:
            raise TuneError("the memory limit (budget minus headroom) must be positive")
        super().__init__(limit_bytes, prior)
        self.measure = measure
        self.minimum, self.maximum = minimum, maximum
        self.rounding: Rounding = rounding
        self.max_trials = max_trials
        self.on_trial = on_trial
        self.cancel = cancel or threading.Event()
        #: Where the probe after the prior aims (:func:`prior_share`).
        self.prior_share = prior_share
        #: A rise of the peak over the range under this is not told from none
        #: (:func:`resolution`).
        self.resolution = resolution

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
        """Search, and return the confirmed recommendation; TuneError when nothing fits
        reliably."""
        recommended: int | None = None
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
            self._repeat_first()
            self._verify(self._predict())
            recommended = self._confirm()
            if recommended is None and self._measure_before_refusing():
                self._verify(self._predict())
                recommended = self._confirm()
        except _OutOfTrials:
            self._note(f"stopped after {self.max_trials} trials (--max-trials)")
            recommended = self._best_accepted()
            if recommended is not None and self.noise.dof == 0:
                self._note(f"{recommended} ran once: raise --max-trials to confirm it by a repeat")
        if recommended is None:
            raise TuneError(self._unreliable())
        good = self.good or recommended
        effect, growth = self.effect(self.minimum, self.maximum, self.resolution)
        if effect is BatchEffect.GROWS:
            rounded = round_batch(recommended, self.rounding, self.minimum)
            if rounded != recommended:
                # Rounding down from a confirmed size keeps it under the limit (memory
                # grows with the batch), but say that this exact size was not run.
                self._note(f"{rounded} is {recommended} rounded down ({self.rounding})")
            recommended = rounded
        else:
            recommended = None
        rates = {
            t.batch_size: t.samples_per_s
            for t in self.trials
            if t.fits(self.limit) and t.samples_per_s
        }
        fit_allocated = self._fit_allocated()
        self._note_coverage()
        self._note_noise(effect)
        return TuneResult(
            fit_allocated=fit_allocated,
            recommended=recommended,
            max_fitting=good,
            predicted=self._model_size(),
            limit_bytes=int(self.limit),
            fit=self.fit,
            trials=list(self.trials),
            knee=throughput_knee(rates),
            notes=list(self.notes),
            noise=self.noise,
            effect=effect,
            minimum=self.minimum,
            maximum=self.maximum,
            growth=growth,
        )

    def _note_noise(self, effect: BatchEffect) -> None:
        """Say when the noise takes a large share of the room the batch has: repeated
        tunings then differ more than their margin suggests."""
        noise = self.noise
        first = self._peaks(self.minimum)
        if effect is not BatchEffect.GROWS or not noise.measured or not first:
            return
        room = self.limit - sum(first) / len(first)
        if room > 0 and noise.margin > 0.25 * room:
            self._note(
                f"the noise margin ({_bytes(noise.margin)}) is {noise.margin / room:.0%} of "
                f"the room the batch has above batch {self.minimum} ({_bytes(room)}): "
                "repeated tunings can differ by more than 10%; a larger budget gives a "
                "steadier answer"
            )

    def _model_size(self) -> int | None:
        """The final fit's largest size under the limit less the noise margin, within the
        range: what the model printed beside it says."""
        if self.fit is None:
            return None
        aim = self.fit.largest_under(self.limit - self.noise.margin)
        if aim is None:
            return self.maximum
        return max(self.minimum, min(int(aim), self.maximum))

    def _unreliable(self) -> str:
        """Why no size could be recommended: the smallest fits, but not reliably."""
        peaks = self._peaks(self.minimum)
        noise = self.noise
        mean = sum(peaks) / len(peaks) if peaks else None
        return (
            f"batch size {self.minimum} does not fit reliably: its runs peak at "
            f"{_bytes(mean)} on average, and {noise.describe()}, so a run can cross the "
            f"limit {_bytes(self.limit)}. Raise the budget, lower the headroom, or shrink "
            "the model."
        )

    def _measure_before_refusing(self) -> bool:
        """Nothing was accepted, yet every run of the smallest size fitted: the margin
        that refused it may stand on a few repeats (two pairs that each drew 0 and 3 heap
        chunks read sd 68 MiB where it is 36, and refused batch 1 of issue 30's MLP at
        588 MiB under a 720 MiB limit). Run the smallest size again until it is accepted
        or the noise stands on :data:`REFUSAL_DOF` degrees of freedom; True when it was
        (the search then goes on from the noise now known)."""
        while self.noise.dof < REFUSAL_DOF and all(
            t.fits(self.limit) for t in self.trials if t.batch_size == self.minimum
        ):
            self._run(self.minimum, "repeat")
            if self._accepted(self.minimum):
                return True
        return False

    def _best_accepted(self) -> int | None:
        """The largest size accepted so far (see :meth:`_accepted`)."""
        sizes = sorted({t.batch_size for t in self.trials}, reverse=True)
        return next((b for b in sizes if self._accepted(b)), None)

    def _repeat_first(self) -> None:
        """Run the smallest size again when the batch adds little to its peak: the noise of
        its fixed part then decides whether the growth is real."""
        first = self._peaks(self.minimum)
        peaks = [float(t.peak_bytes) for t in self.trials if t.fits(self.limit)]
        if len(first) != 1 or not peaks:
            return
        if max(peaks) - first[0] < SMALL_GROWTH * first[0]:
            self._run(self.minimum, "repeat")

    def _confirm(self) -> int | None:
        """Repeat the size nearest the limit until the noise of identical runs is known
        there, then settle on the answer (:meth:`_settle`)."""
        candidate = self.good
        while candidate is not None:
            runs = [t for t in self.trials if t.batch_size == candidate]
            if not all(t.fits(self.limit) for t in runs):
                break  # a repeat crossed the limit: the answer is below it
            peaks = self._peaks(candidate)
            noise = self.noise
            visible = 2 * noise.spread > AGREE * self._room()
            # Runs that agree to the byte while the fit's residuals scatter (glibc's
            # heap: 16 MiB steps, ties are common) say nothing yet: one more.
            tied = noise.spread == 0 and self._fit_sd() > 0.005 * self.limit and len(peaks) < 3
            if len(peaks) < 2 or (visible and noise.dof < 2) or tied:
                # Nearest the limit, where a run that peaks higher fails: measure it there.
                self._run(candidate, "repeat")
                continue
            break
        answer = self._settle()
        # Where identical runs differ, more runs where the answer is, until it is known to
        # PRECISION (each may move it: the model takes them in). Not at the range's top,
        # which the batch does not limit.
        while (
            answer is not None
            and answer < self.maximum
            and self._uncertainty(answer) > PRECISION
            and len(self.trials) < self.max_trials - 1  # one left for a moved answer
        ):
            self._run(answer, "repeat")
            answer = self._settle()
        return answer

    def _uncertainty(self, batch: int) -> float:
        """The standard error of the answer near ``batch``, as a share of it: from how well
        the runs pin the mean peak there (a line through them all) and the noise margin
        (two sd, known to ``sqrt(2 dof)``), at the fit's slope."""
        runs = self._runs()
        fit, noise = self.fit, self.noise
        if fit is None or len(runs) < 3 or noise.sigma <= 0:
            return 0.0
        slope = fit.slope + 2 * fit.quadratic * batch
        if slope <= 0:
            return 0.0
        sizes = np.array([b for b, _ in runs], dtype=float)
        sxx = float(np.sum((sizes - sizes.mean()) ** 2)) or 1.0
        level = noise.sigma * math.sqrt(1 / len(runs) + (batch - sizes.mean()) ** 2 / sxx)
        dof = max(noise.dof, len(runs) - 2)
        margin = MARGIN_SDS * noise.sigma / math.sqrt(2 * dof)
        return math.hypot(level, margin) / slope / batch

    def _settle(self) -> int | None:
        """The size to recommend, or None when not even the smallest is safe.

        The largest size whose runs were accepted (:meth:`_accepted`); with noisy runs,
        where the model through every run meets the limit less the noise margin if that
        is higher (below every size that failed). The model averages all the runs, where
        one run of a size sits up to two sd off its mean either way: stepping down by
        one run's excess instead made three tunings of one script differ by 40%. A size
        the model picks that never ran is run once; should that run cross the limit, the
        answer is looked for again below it."""
        while True:
            answer = self._best_accepted()
            modelled = self._model_size()
            fit = self.fit
            if self.noise.sigma > 0 and modelled is not None and fit is not None:
                failed = self.failed
                if failed is not None:
                    modelled = min(modelled, failed - 1)
                modelled = round_batch(modelled, self.rounding, self.minimum)
                fits_model = fit.peak(modelled) + self.noise.margin <= self.limit
                # A size within 5% of one already accepted, or whose modelled peak is
                # within CONFIRM_GAIN of it, is not worth a trial.
                if fits_model and (
                    answer is None
                    or (
                        modelled > answer * (1 + VERIFY_TOLERANCE)
                        and fit.peak(modelled) - fit.peak(answer) > CONFIRM_GAIN * self.limit
                    )
                ):
                    answer = modelled
            if answer is None or answer in {t.batch_size for t in self.trials}:
                return answer
            trial = self._run(answer, "confirm")
            if not trial.ok and not trial.oom:
                raise TuneError(f"the trial at batch size {answer} failed: {trial.message}")
            if trial.fits(self.limit):
                return answer

    def _room(self) -> float:
        """The room the batch has: the limit less the smallest size's mean peak."""
        first = self._peaks(self.minimum)
        return self.limit - (sum(first) / len(first) if first else 0.0)

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
            and (not self._grown_beyond(last, enough) or self.fit is None)
            and last.batch_size < self.maximum
        ):
            b = last.batch_size
            if b >= 16 * self.minimum and (last.peak_bytes or 0) - base < SMALL_GROWTH * base:
                # 16x the smallest size adds under a tenth of its peak: is that growth
                # more than noise? The smallest size's second run says.
                self._repeat_first()
                base = sum(self._peaks(self.minimum)) / len(self._peaks(self.minimum))
            sizes = {t.batch_size for t in self.trials if t.ok}
            if self.fit is None:
                nxt = b * 2
            elif self.fit.slope <= 0 and max(sizes) < 256 * min(sizes):
                nxt = b * 16  # no growth yet, or only noise: out of the noise first
            elif self.fit.slope <= 0 and self.fit.quadratic <= 0:
                # No growth over sizes 256x apart: the range's top says whether there is
                # any (more probes would say the same, slower).
                nxt = self.maximum
            else:
                aim = self.fit.largest_under(target)
                nxt = int(aim) if aim is not None else b * 8
                # While the growing part is lost in the noise of the fixed part (under
                # three sd of identical runs; before any repeat, under a tenth of it), the
                # slope is a guess: jump 16x to get out of the noise. Once it shows, at
                # most 8x: memory may grow faster than the line, which the fit sees from
                # four sizes on.
                if last.peak_bytes - base < self._hidden_growth(base):
                    nxt = b * 16
                else:
                    nxt = max(b * 2, min(nxt, b * 8))
            if b >= 16 * self.minimum:  # below, a jump covers a few samples whatever it costs
                # At least a doubling: where the noise dwarfs the room, the steepest slope
                # is all noise, and probes crept up by 5% a trial.
                nxt = min(nxt, max(self._safe_leap(last, base), 2 * b))
            nxt = min(max(nxt, b + 1), self.maximum)
            last = self._run(nxt, "probe")
            if not last.ok and not last.oom:
                raise TuneError(f"the trial at batch size {nxt} failed: {last.message}")

    def _hidden_growth(self, base: float) -> float:
        """How much growth the noise can hide above ``base``, the smallest size's peak:
        three sd of identical runs; before any repeat, a tenth of ``base``."""
        noise = self.noise
        return 3 * noise.sigma if noise.measured else SMALL_GROWTH * base

    def _safe_leap(self, last: Trial, base: float) -> int:
        """The largest size the next probe may take: where the steepest slope that ``last``
        and the noise allow reaches :data:`LEAP_SHARE` of the room above ``base`` (a peak
        read low by the noise hides up to three sd of growth; before any repeat, a tenth
        of the smallest size's peak)."""
        rise = max(float(last.peak_bytes or 0) - base, 0.0) + self._hidden_growth(base)
        steepest = rise / max(last.batch_size - self.minimum, 1)
        reach = (self.limit - base) * LEAP_SHARE / steepest if steepest > 0 else math.inf
        return int(min(self.minimum + reach, self.maximum))

    def _grown_beyond(self, last: Trial, enough: float) -> bool:
        """True when ``last``'s peak is past ``enough`` and, once noise was measured, three
        standard deviations of it above the smallest size: a slope read off less is noise."""
        first = self._peaks(self.minimum)
        growth = (last.peak_bytes or 0) - sum(first) / len(first)
        return (last.peak_bytes or 0) >= enough and growth >= 3 * self.noise.sigma

    def _scale(self) -> None:
        """One trial where the fake step's model, on the first trial, fills
        :attr:`prior_share` of the room: what the real process pays per tensor byte (RSS
        over tensors on CPU, the allocator's rounding on a device) sets the scale before
        the prediction goes near the limit."""
        first = self.trials[0]
        if self.fit is None or first.peak_bytes is None:
            return
        base = first.peak_bytes
        aim = self.fit.largest_under(base + (self.limit - base) * self.prior_share)
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
        aim = fit.largest_under(self.limit - self._aim_margin()) if fit is not None else None
        if aim is None:
            self._note(
                "peak memory did not grow with the batch size in these trials: the "
                "maximum of the range is tried"
            )
            aim = self.maximum
        upper = self.failed
        ceiling = min(self.maximum, upper - 1 if upper is not None else self.maximum)
        return max(good, min(int(aim), ceiling))

    def _aim_margin(self) -> float:
        """How far under the limit a predicted or cut size aims: by the fit's own scatter
        (2-4% of the limit), or the noise margin once repeats measured it. A size that
        lands just over the limit, or within the noise of it, costs more trials; one just
        under costs 2% of the size."""
        fit = self.fit
        scatter = 2 * fit.rms_residual if fit is not None else 0.0
        spread = min(max(scatter, PREDICT_MARGIN * self.limit), 0.04 * self.limit)
        return max(spread, self.noise.margin)

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
                if (
                    failed - good <= max(1, VERIFY_TOLERANCE * good)
                    or self._within_noise(good, failed)
                    or self._at_limit(good)
                ):
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

    def _within_noise(self, good: int, failed: int) -> bool:
        """True when the peaks of ``good`` and ``failed`` differ by less than identical
        runs do (or, before any repeat, by under 3% of the limit): a cut between them
        would be decided by the noise, not by the batch. The confirmation that follows
        measures that noise and steps down from ``good`` if it must."""
        low, high = self._peaks(good), self._peaks(failed)
        if not low or not high:
            return False
        return max(high) - sum(low) / len(low) <= self._noise_band()

    def _noise_band(self) -> float:
        """Two peaks closer than this are not told apart: the widest difference identical
        runs showed, or three sd of them; before any repeat, 3% of the limit."""
        noise = self.noise
        return max(noise.spread, 3 * noise.sigma) if noise.measured else 0.03 * self.limit

    def _at_limit(self, good: int) -> bool:
        """True when ``good``'s peak is already within the noise of the limit: a larger
        size cannot be accepted with the margin a recommendation keeps, so a cut above it
        only adds a trial over the limit (one read 240 of 240 MiB, then cut to 371)."""
        peaks = self._peaks(good)
        return bool(peaks) and max(peaks) >= self.limit - self._noise_band()

    def _between(self, good: int, failed: int) -> int:
        """Where to cut between a size that fitted and one that did not: where the line
        through their measured peaks meets the limit (when both peaks are known), else
        where the model says, unless the model had said the failed size would fit (it is
        wrong up there: a device smaller than the budget, an eval pass): then halfway."""
        by_size = {t.batch_size: t for t in self.trials}
        low, high = by_size[good].peak_bytes, by_size[failed].peak_bytes
        said = by_size[failed].predicted_bytes
        if low is not None and high is not None and high > low:
            # Where the line meets the limit less the margin: a cut aimed at the limit
            # itself lands over it as often as under (241 failed at 249 MiB of 240, and
            # the cut to 236 failed too).
            aim = good + (self.limit - self._aim_margin() - low) / (high - low) * (failed - good)
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
