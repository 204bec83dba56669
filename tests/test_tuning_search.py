"""The batch-size search against synthetic models whose true maximum is known exactly."""

from __future__ import annotations

import math
import random
import threading

import numpy as np
import pytest

from torchmem.tuning.model import Fit, fit_peaks, round_batch, throughput_knee
from torchmem.tuning.search import BatchSearch, Trial, TuneCancelled, TuneError

MiB = 1 << 20
GiB = 1 << 30


class Model:
    """A training script's memory: ``fixed + per_sample*b + quad*b²`` with noise, that
    runs out of memory above ``capacity`` (the budget the trial runner enforces)."""

    def __init__(self, fixed, per_sample, quad=0.0, noise=0.0, capacity=None, fail_at=None):
        self.fixed, self.per_sample, self.quad = fixed, per_sample, quad
        self.noise = noise
        self.capacity = capacity
        self.fail_at = fail_at
        self.rng = random.Random(7)
        self.calls: list[int] = []

    def peak(self, b: float) -> float:
        return self.fixed + self.per_sample * b + self.quad * b * b

    def largest_under(self, limit: float) -> int:
        b = 0
        step = 1 << 20
        while step:  # exact, independent of the search's own algebra
            if self.peak(b + step) <= limit:
                b += step
            else:
                step //= 2
        return b

    def __call__(self, b: int, role: str, predicted: float | None) -> Trial:
        self.calls.append(b)
        if self.fail_at is not None and b >= self.fail_at:
            return Trial(b, None, ok=False, oom=False, message="ValueError: shapes mismatch")
        peak = self.peak(b) * (1 + self.rng.uniform(-self.noise, self.noise))
        if self.capacity is not None and peak > self.capacity:
            return Trial(b, int(peak), ok=False, oom=True, message="out of memory")
        return Trial(b, int(peak), ok=True, oom=False, samples_per_s=1000 * b / (b + 16))


@pytest.mark.parametrize(
    ("fixed", "per_sample", "limit"),
    [
        (300 * MiB, 2 * MiB, 6 * GiB),  # a small CNN on CPU: max near 3000
        (1.5 * GiB, 40 * MiB, 20 * GiB),  # a big model: max near 470
        (200 * MiB, 0.1 * MiB, 2 * GiB),  # tiny samples: max beyond 4096 -> the range's max
        (5 * GiB, 1 * GiB, 9.5 * GiB),  # huge samples: max 4
    ],
)
def test_linear_models_within_5_percent_in_8_trials_without_oom(fixed, per_sample, limit):
    model = Model(fixed, per_sample, noise=0.01, capacity=limit * 1.12)
    result = BatchSearch(model, limit, 1, 4096).run()
    true_max = min(model.largest_under(limit), 4096)
    assert result.recommended <= true_max * 1.0001 or model.peak(result.recommended) <= limit * 1.01
    assert result.recommended >= 0.95 * true_max, (result.recommended, true_max, model.calls)
    # Probes, the prediction, one repeat of the size nearest the limit (its noise), and
    # one of the smallest where the batch adds little to it.
    assert len(result.trials) <= 8, model.calls
    assert any(t.role == "repeat" for t in result.trials), [t.role for t in result.trials]
    assert result.ooms == 0
    assert all(t.fits(limit) for t in result.trials if t.batch_size == result.recommended)


def test_a_quadratic_model_is_recognised_and_the_recommendation_fits():
    model = Model(400 * MiB, 1 * MiB, quad=0.02 * MiB, noise=0.005, capacity=8 * GiB)
    limit = 6 * GiB
    result = BatchSearch(model, limit, 1, 4096).run()
    assert result.fit is not None and result.fit.is_quadratic
    assert any("quadratic" in note for note in result.notes)
    assert model.peak(result.recommended) <= limit * 1.01
    assert result.recommended >= 0.9 * model.largest_under(limit)


def test_an_oom_below_the_prediction_is_bisected_with_the_model():
    # The memory model says 3000 fits, but something the probes did not see (an eval pass,
    # fragmentation) runs out at 2000: the search recovers with a new process per trial.
    model = Model(300 * MiB, 2 * MiB, noise=0.0, capacity=300 * MiB + 2 * MiB * 2000)
    result = BatchSearch(model, 6 * GiB, 1, 4096, max_trials=12).run()
    assert result.ooms >= 1
    assert 1800 <= result.recommended < 2000
    assert result.trials[-1].ok or result.recommended < min(
        t.batch_size for t in result.trials if t.oom
    )


def test_rounding_keeps_the_recommendation_a_multiple_or_power():
    model = Model(300 * MiB, 2 * MiB, capacity=7 * GiB)
    for rounding, check in (
        ("multiple8", lambda b: b % 8 == 0),
        ("pow2", lambda b: b & (b - 1) == 0),
    ):
        result = BatchSearch(model, 6 * GiB, 1, 4096, rounding=rounding).run()
        assert check(result.recommended), (rounding, result.recommended)
        assert model.peak(result.recommended) <= 6 * GiB


def test_a_budget_smaller_than_the_first_size_is_a_clear_error():
    with pytest.raises(TuneError, match="batch size 1 does not fit"):
        BatchSearch(Model(2 * GiB, 1 * MiB), 1 * GiB, 1, 64).run()


def test_a_script_that_fails_at_some_size_is_reported_with_its_message():
    with pytest.raises(TuneError, match=r"batch size .* failed: .*shapes mismatch"):
        BatchSearch(Model(100 * MiB, 1 * MiB, fail_at=8), 4 * GiB, 1, 4096).run()


def test_bad_ranges_and_limits_are_refused():
    with pytest.raises(TuneError, match="range"):
        BatchSearch(Model(0, 1), 1 * GiB, 8, 4)
    with pytest.raises(TuneError, match="positive"):
        BatchSearch(Model(0, 1), -5, 1, 4)


def test_cancel_stops_before_the_next_trial():
    cancel = threading.Event()
    model = Model(300 * MiB, 2 * MiB)

    def measure(b, role, predicted):
        trial = model(b, role, predicted)
        if len(model.calls) == 2:
            cancel.set()  # the user pressed Cancel during the second trial
        return trial

    with pytest.raises(TuneCancelled):
        BatchSearch(measure, 6 * GiB, 1, 4096, cancel=cancel).run()
    assert len(model.calls) == 2


def test_fit_and_helpers():
    fit = fit_peaks([1, 2, 4, 8], [110, 120, 140, 180])
    assert fit.intercept == pytest.approx(100) and fit.slope == pytest.approx(10)
    assert not fit.is_quadratic and fit.largest_under(1100) == pytest.approx(100)
    with pytest.raises(ValueError):
        fit_peaks([4, 4], [1, 2])
    assert round_batch(1000.7, "multiple8") == 1000 and round_batch(1023, "multiple8") == 1016
    assert round_batch(1000, "pow2") == 512 and round_batch(5, "none") == 5
    assert round_batch(0.3, "pow2", minimum=1) == 1
    assert throughput_knee({8: 100.0, 16: 189.0, 32: 196.0, 64: 200.0}) == 32
    assert throughput_knee({}) is None
    assert math.isclose(fit.peak(3), 130)


def test_a_refused_argument_is_named_not_the_batch_option_in_the_usage_line():
    """`tune --budget 640MiB mlp_adam.py --device cuda:0` passed --device to the script,
    and the trial said the script "does not take --batch-size": argparse's usage line,
    which lists --batch-size, was searched with its error."""
    from torchmem.tuning.trial import TrialPlan, measured_trial

    plan = TrialPlan("mlp_adam.py", ("--device", "cuda:0"), "--batch-size", budget_bytes=GiB)
    usage = "usage: mlp_adam.py [-h] [--batch-size BATCH_SIZE] [--steps STEPS]\n"
    stderr = usage + "mlp_adam.py: error: unrecognized arguments: --device cuda:0\n"
    trial = measured_trial(plan, 1, 2, 0, None, {}, stderr, 2.0)
    assert not trial.ok and "does not take --device cuda:0" in trial.message, trial.message
    assert "--batch-arg" not in trial.message
    stderr = "usage: train.py [--bs BS]\ntrain.py: error: unrecognized arguments: --batch-size 1"
    trial = measured_trial(plan, 1, 2, 0, None, {}, stderr, 2.0)
    assert "does not take --batch-size" in trial.message and "--batch-arg" in trial.message
    stderr = "error: unrecognized arguments: --batch-size=1"  # given as --batch-size=8
    trial = measured_trial(plan, 1, 2, 0, None, {}, stderr, 2.0)
    assert "does not take --batch-size" in trial.message and "--batch-arg" in trial.message


def test_an_accelerator_trial_is_judged_on_peak_reserved_not_rss():
    # What a trial on cuda:0 reads from its child's summary (no GPU here: the summary a
    # CUDA run writes is given as it would be).
    from torchmem.tuning.trial import TrialPlan, measured_trial

    plan = TrialPlan("train.py", (), "--batch-size", steps=3, device="cuda:0", budget_bytes=8 * GiB)
    summary = {
        "status": "finished",
        "steps": 4,
        "step_time_s": 0.5,
        "peak_bytes": {"cuda:0": 3 * GiB, "cpu_rss": 2 * GiB},
        "peak_reserved_bytes": {"cuda:0": 4 * GiB},
        "peak_rss_bytes": 2 * GiB,
    }
    trial = measured_trial(plan, 64, 0, 0, None, summary, "", 6.0)
    assert trial.ok and trial.peak_bytes == 4 * GiB
    assert trial.peak_allocated_bytes == 3 * GiB and trial.peak_reserved_bytes == 4 * GiB
    assert trial.samples_per_s == 128
    oom = measured_trial(plan, 128, 1, 0, None, {**summary, "status": "out of memory"}, "", 3.0)
    assert oom.oom and not oom.ok
    cpu_only = {**summary, "peak_bytes": {"cpu_rss": 2 * GiB}, "peak_reserved_bytes": {}}
    unused = measured_trial(plan, 64, 0, 0, None, cpu_only, "", 6.0)
    assert not unused.ok and not unused.oom and "no cuda:0 memory" in unused.message


def test_allocated_and_reserved_are_fitted_apart_and_a_growing_cache_is_said():
    def measure(b: int, role: str, predicted: float | None) -> Trial:
        allocated = 2 * GiB + 10 * MiB * b
        reserved = 2 * GiB + 15 * MiB * b  # the cache grows half as fast again as tensors
        return Trial(b, reserved, ok=True, oom=False, peak_allocated_bytes=allocated,
                     peak_reserved_bytes=reserved)  # fmt: skip

    result = BatchSearch(measure, 20 * GiB).run()
    assert result.fit_allocated.slope == pytest.approx(10 * MiB, rel=1e-6)
    assert result.fit.slope == pytest.approx(15 * MiB, rel=1e-6)
    # The budget is on reserved: the recommendation is where reserved meets the limit
    # (less the search's 1-3 % aim under it), not where allocated would.
    exact = (18 * GiB) // (15 * MiB)
    assert 0.97 * exact <= result.recommended <= exact
    assert any("reserved memory grows 1.50x as fast as allocated" in n for n in result.notes)
    assert any(line.startswith("allocated alone: peak") for line in result.explain())


@pytest.mark.parametrize("scale", [1.0, 1.3, 1.6])
@pytest.mark.parametrize(
    ("fixed", "per_sample", "quad", "limit"),
    [
        (300 * MiB, 2 * MiB, 0.0, 6 * GiB),
        (1.5 * GiB, 40 * MiB, 0.0, 20 * GiB),
        (400 * MiB, 1 * MiB, 0.02 * MiB, 6 * GiB),  # attention: quadratic
    ],
)
def test_a_fake_step_prior_needs_four_trials_even_when_it_undercounts(
    fixed, per_sample, quad, limit, scale
):
    # The fake step sees tensors only: the real process pays `scale` times as much per
    # tensor byte (RSS over tensors on CPU), and a base it cannot see at all.
    from torchmem.tuning.model import Fit

    model = Model(fixed, per_sample * scale, quad=quad * scale, noise=0.005,
                  capacity=limit * 1.11)  # fmt: skip
    prior = Fit(intercept=5 * MiB, slope=per_sample, quadratic=quad)
    result = BatchSearch(model, limit, 1, 4096, prior=prior).run()
    true_max = min(model.largest_under(limit), 4096)
    assert result.ooms == 0 and len(result.trials) <= 4, model.calls
    assert 0.95 * true_max <= result.recommended, (result.recommended, true_max, model.calls)
    assert model.peak(result.recommended) <= limit * 1.01
    assert [t.role for t in result.trials] == ["probe", "probe", "verify", "repeat"]
    assert result.trials[2].predicted_bytes == pytest.approx(result.trials[2].peak_bytes, rel=0.05)
    assert (result.fit is not None and result.fit.is_quadratic) == (quad > 0)


def test_a_prior_that_overcounts_badly_still_ends_under_the_limit():
    from torchmem.tuning.model import Fit

    model = Model(300 * MiB, 2 * MiB, noise=0.0, capacity=6.6 * GiB)
    prior = Fit(intercept=0, slope=6 * MiB)  # three times what the real step costs
    result = BatchSearch(model, 6 * GiB, 1, 4096, prior=prior).run()
    assert result.ooms == 0 and result.recommended >= 0.95 * model.largest_under(6 * GiB)


def test_a_quadratic_term_an_early_fit_had_is_not_said_once_the_final_fit_drops_it(
    monkeypatch,
):
    # The demo's peak reserved bytes on an H200 (torchmem tune --device cuda:0): the fits
    # of the first five trials have a quadratic term, the answer's fit does not.
    sizes = [1, 2, 16, 256, 512, 1182, 1630]
    peaks = [90, 90, 96, 330, 670, 1486, 2030]
    from torchmem.tuning import evidence

    quadratic = []

    def fit_peaks(*args, **kwargs):
        fit = real_fit_peaks(*args, **kwargs)
        quadratic.append(fit.is_quadratic)
        return fit

    real_fit_peaks = evidence.fit_peaks
    monkeypatch.setattr(evidence, "fit_peaks", fit_peaks)

    def measure(b: int, role: str, predicted: float | None) -> Trial:
        peak = int(np.interp(b, sizes, peaks) * MiB)
        return Trial(b, peak, ok=True, oom=False, samples_per_s=10.0 * b)

    result = BatchSearch(measure, 2048 * MiB, 1, 16384).run()
    # 2030 MiB at 1630, flat beyond (np.interp): about 1630 or more fits.
    assert result.recommended >= 1600 and any(quadratic) and not result.fit.is_quadratic
    assert not any("quadratic" in note for note in result.notes), result.notes


class HeapNoise:
    """A CPU script's peak RSS as glibc gives it: the model's bytes plus 0-3 whole 16 MiB
    tensors kept resident or not, at random in each run (an MLP with Adam on CPU, measured:
    665-713 MiB over five identical runs at batch 1)."""

    QUANTUM, LEVELS = 16 * MiB, 4

    def __init__(self, seed: int, fixed: float = 665 * MiB, per_sample: float = 300 * 1024):
        self.rng = random.Random(seed)
        self.fixed, self.per_sample = fixed, per_sample
        self.calls: list[int] = []

    def run(self, b: int) -> int:
        """One plain run's peak at batch ``b``."""
        return int(
            self.fixed + self.per_sample * b + self.QUANTUM * self.rng.randrange(self.LEVELS)
        )

    def __call__(self, b: int, role: str, predicted: float | None) -> Trial:
        self.calls.append(b)
        return Trial(b, self.run(b), ok=True, oom=False)


def test_a_noisy_rss_recommendation_fits_every_plain_run_and_tunings_agree():
    budget = 1400 * MiB
    limit = budget - budget // 10
    recommended = []
    over_limit = []
    for seed in range(150):
        script = HeapNoise(seed)
        result = BatchSearch(script, limit, 1, 4096).run()
        # Noise was measured where the answer is decided, and said.
        assert result.noise.measured
        assert any("identical runs differ" in line for line in result.explain())
        # Five plain runs of the recommendation (and many more) stay under the budget.
        runs = [script.run(result.recommended) for _ in range(200)]
        assert max(runs[:5]) <= budget and max(runs) <= budget, (seed, result.recommended)
        over_limit.append(sum(r > limit for r in runs) / len(runs))
        recommended.append(result.recommended)
    # The margin aims at 2 sd: most runs stay under the limit too (the headroom takes the
    # rest), though a margin measured from a few runs is sometimes short.
    assert sum(over_limit) / len(over_limit) <= 0.1, over_limit
    # Three tunings of the same script agree within 10%: nine trios in ten (a margin
    # measured from a few runs is itself noisy: 90 of 100 trios agreed over 300 seeds,
    # whether the noise was pooled or the larger estimate taken).
    trios = [recommended[i : i + 3] for i in range(0, len(recommended), 3)]
    agreeing = sum(max(trio) <= 1.1 * min(trio) for trio in trios)
    assert agreeing >= 0.85 * len(trios), (agreeing, trios)


def test_a_few_noisy_repeats_do_not_refuse_a_size_that_fits():
    # Issue 30's MLP at a 800 MiB budget: 540 MiB + 70 KiB a sample, and 0 to 3 heap
    # chunks of 32 MiB kept in each run, so identical runs differ by up to 96 MiB, half
    # the room. Two pairs of repeats that each drew 0 and 3 chunks read sd 68 MiB (it is
    # 36): the search once refused batch 1 ("does not fit reliably", its runs 588 MiB on
    # average under a 720 MiB limit) or recommended 1.
    answers = []
    for seed in range(100):
        script = HeapNoise(seed, fixed=540 * MiB, per_sample=70 * 1024)
        script.QUANTUM = 32 * MiB
        prior = Fit(62.7 * MiB, 44.38 * 1024)
        result = BatchSearch(script, 720 * MiB, 1, 4096, prior=prior, prior_share=0.2).run()
        assert max(script.run(result.recommended) for _ in range(5)) <= 800 * MiB, seed
        answers.append(result.recommended)
    # Every size up to ~1200 fits every run under the limit: no answer is a tenth of it.
    assert min(answers) >= 120, sorted(answers)[:5]


def test_a_verified_size_within_the_noise_of_the_limit_is_not_recommended():
    # One lucky run under the limit is not enough: the size nearest the limit is run again,
    # and the search steps down until the runs' mean is two sd under it.
    script = HeapNoise(3)
    limit = 1260 * MiB
    result = BatchSearch(script, limit, 1, 4096).run()
    nearest = [t for t in result.trials if t.batch_size == result.recommended]
    assert len(nearest) >= 2 or any(t.role == "confirm" for t in result.trials)
    mean = 665 * MiB + 300 * 1024 * result.recommended + 24 * MiB
    assert mean + 2 * 16 * MiB <= limit * 1.01


def test_no_bisection_between_two_sizes_whose_peaks_differ_by_less_than_the_noise():
    for seed in range(12):
        result = BatchSearch(HeapNoise(seed), 1260 * MiB, 1, 4096).run()
        noise = result.noise
        peaks = {}
        for t in result.trials:
            peaks.setdefault(t.batch_size, []).append(t.peak_bytes)
        for i, t in enumerate(result.trials):
            if t.role != "bisect":
                continue
            earlier = result.trials[:i]
            fitted = [e for e in earlier if e.fits(1260 * MiB)]
            failed = [e for e in earlier if not e.fits(1260 * MiB)]
            low = max(fitted, key=lambda e: e.batch_size)
            high = min(failed, key=lambda e: e.batch_size)
            assert high.peak_bytes - low.peak_bytes > noise.spread / 2, (seed, result.trials)


def test_a_script_that_ignores_the_batch_option_gets_no_recommendation():
    # "peak ≈ 311.9 MiB + -44 B x batch, recommended 4096": what an unused option looked like.
    script = HeapNoise(1, fixed=300 * MiB, per_sample=0)
    result = BatchSearch(script, 2 * GiB, 1, 4096).run()
    assert result.effect.value == "none" and result.recommended is None
    first = result.explain("--batch-size")[0]
    assert "does not seem to read --batch-size" in first and "recommended" not in first
    # What a user asks next: whether the largest size can run at all.
    assert "every run of 4096 stayed under the limit" in first
    assert len(result.trials) <= 7, script.calls


def test_a_batch_that_adds_less_than_the_noise_over_the_range_gets_no_precise_answer():
    # 8 MiB over the whole range where identical runs differ by up to 48 MiB.
    for seed in range(5):
        script = HeapNoise(seed, fixed=300 * MiB, per_sample=2 * 1024)
        result = BatchSearch(script, 2 * GiB, 1, 4096).run()
        assert result.effect.value in ("none", "negligible") and result.recommended is None
        first = result.explain("--batch-size")[0]
        assert "recommended" not in first and "noise of identical runs" in first, first


def test_the_smallest_size_within_the_noise_of_the_limit_is_an_error_that_names_the_noise():
    # Batch 1 peaks at 665, 681, 697 or 713 MiB: a quarter of its runs cross 705 MiB.
    limit = 705 * MiB
    budget = limit / 0.9
    reliably = 0
    for seed in range(8):
        script = HeapNoise(seed, 665 * MiB, 75 * 1024)
        try:
            result = BatchSearch(script, limit, 1, 4096).run()
        except TuneError as error:
            assert "batch size 1 does not fit" in str(error)
            if "reliably" in str(error):  # its first run fitted: the noise is named
                assert "identical runs differ by up to" in str(error)
                reliably += 1
            continue
        # Where its runs happened to come out low, what it says still fits the budget.
        assert max(script.run(result.recommended) for _ in range(200)) <= budget
    assert reliably >= 3


def test_the_models_prediction_is_what_the_final_fit_gives():
    model = Model(300 * MiB, 2 * MiB, noise=0.01, capacity=6.7 * GiB)
    result = BatchSearch(model, 6 * GiB, 1, 4096).run()
    fit = result.fit
    assert result.predicted == int(fit.largest_under(result.limit_bytes - result.noise.margin))
    assert f"the model's largest under the limit: {result.predicted}" in result.explain()[0]


def test_the_quadratic_note_names_no_architecture():
    model = Model(400 * MiB, 1 * MiB, quad=0.02 * MiB, capacity=6.6 * GiB)
    result = BatchSearch(model, 6 * GiB, 1, 4096, max_trials=14).run()
    assert result.fit.is_quadratic
    note = next(n for n in result.notes if "quadratic" in n)
    assert "attention" not in note


def test_a_growth_probe_out_of_the_noise_does_not_leap_past_the_limit():
    # 1 MiB a sample over 300 MiB, identical runs differing by up to 24 MiB: at 32 the
    # growth is lost in the noise, and a 16x jump out of it landed at 512, twice the room.
    # The steepest slope the runs allow keeps every growth probe under the limit, and the
    # search back from a miss costs at most one more run over it.
    limit = 540 * MiB
    over = []
    for seed in range(40):
        script = HeapNoise(seed, fixed=300 * MiB, per_sample=MiB)
        script.QUANTUM = 8 * MiB
        result = BatchSearch(script, limit, 1, 4096).run()
        probes = [t for t in result.trials if t.role == "probe"]
        assert all(t.fits(limit) for t in probes), (seed, script.calls)
        over.append(sum(not t.fits(limit) for t in result.trials))
        # The answer is one every plain run of it fits (the top of the noise: +24 MiB).
        assert 300 * MiB + MiB * result.recommended + 24 * MiB <= limit / 0.9
    assert max(over) <= 2 and sum(over) / len(over) <= 0.5, over


def test_a_fake_steps_bends_are_not_read_as_growth_faster_than_linear():
    # The fake step's exact peaks of issue 30's MLP (4 Linear layers of 2048, Adam): the
    # peak moves from the optimizer's step to the backward as the batch grows, so its
    # slope goes 16, 33, then 48 KiB a sample. A least-squares fit read that as a square
    # ("memory grows faster than linearly", of an MLP).
    from torchmem.tuning.model import fit_exact

    def mlp(b: int) -> int:
        return max(100_876_376 + 16_392 * b, 84_434_776 + 32_776 * b, 50_522_072 + 49_160 * b)

    sizes = [1, 8, 64, 512, 1448, 4096]
    fit = fit_exact([(b, mlp(b)) for b in sizes])
    assert not fit.is_quadratic, fit
    assert fit.peak(1448) == pytest.approx(mlp(1448)) and fit.peak(4096) == pytest.approx(mlp(4096))
    # Never under the truth where the answer lies (between the top two sizes).
    assert all(fit.peak(b) >= mlp(b) for b in range(1448, 4097, 16))
    model = Model(600 * MiB, 48 * 1024, noise=0.0, capacity=1.1 * GiB)
    result = BatchSearch(model, 1 * GiB, 1, 4096, prior=fit).run()
    assert not any("faster than linearly" in n for n in result.notes), result.notes

    # A real square (a contrastive loss's batch-by-batch matrix) is kept, exactly.
    def contrastive(b: int) -> int:
        return 5 * MiB + 4096 * b + 12 * b * b

    square = fit_exact([(b, contrastive(b)) for b in sizes])
    assert square.quadratic == pytest.approx(12) and square.slope == pytest.approx(4096)


def test_a_script_the_fake_step_saw_read_the_option_is_never_said_not_to_read_it():
    # Issue 30's MLP: 44 KiB a sample under the noise of 600 MiB processes. The runs alone
    # cannot tell its growth from none, and it was told it "does not seem to read
    # --batch-size"; the fake step had seen its tensors grow with the batch.
    from torchmem.tuning.model import Fit

    said = []
    for seed in range(5):
        script = HeapNoise(seed, fixed=300 * MiB, per_sample=2 * 1024)
        prior = Fit(intercept=100 * MiB, slope=2 * 1024)
        result = BatchSearch(script, 2 * GiB, 1, 4096, prior=prior).run()
        assert result.effect.value in ("negligible", "grows"), result.effect
        said.append(result.explain("--batch-size")[0])
    assert not any("does not seem to read" in line for line in said), said


def test_an_unread_option_whose_top_size_drew_the_high_heap_mode_is_still_unread():
    # A clean-clone CI run of linear_memory.py --ignore-batch read "grows": both runs of
    # 4096 peaked 12 MiB above every smaller size (glibc's heap, not the batch). Where the
    # fake steps saw no tensor grow with the batch, that is no growth; memory a script
    # does tie to the batch outside tensors still is.
    from torchmem.tuning.search import resolution

    def script(extra):
        def run(b: int, role: str, predicted: float | None) -> Trial:
            peak = 320 * MiB + (12 * MiB if b == 4096 else 0) + extra * b
            return Trial(b, int(peak), ok=True, oom=False, samples_per_s=1000.0)

        return run

    def effect(extra, flat):
        return BatchSearch(script(extra), 2 * GiB, 1, 4096, resolution=resolution("cpu", flat))

    assert effect(0, flat=False).run().effect.value == "grows"  # the CI run's answer
    unread = effect(0, flat=True).run()
    assert unread.effect.value == "none" and unread.recommended is None
    assert "does not seem to read --batch-size" in unread.explain("--batch-size")[0]
    # Decoded images kept per sample (50 KiB each, 200 MiB at 4096): the batch's.
    assert effect(50 * 1024, flat=True).run().effect.value == "grows"
    assert resolution("cuda:0", flat=True) == 0.0  # an allocator counts bytes exactly
