"""Allocator thrash in a tuning trial: the caching allocator freeing its cache and
retrying on two consecutive steps makes a size not fit (Composer's rule), from the
backend's boundary reading to the search's answer. Never run on a GPU here: the CUDA
runtime is the stub of conftest."""

from __future__ import annotations

import pytest
from helpers import check_summary

from torchmem.events import Marker, MarkerKind, Sample
from torchmem.probe.backends import RETRIES_ENV, TorchAllocatorBackend
from torchmem.report.summary import run_summary
from torchmem.retry_streaks import RetryStreaks
from torchmem.session import Session
from torchmem.tuning.search import BatchSearch, Trial
from torchmem.tuning.trial import TrialPlan, measured_trial

MiB, GiB = 1 << 20, 1 << 30


def boundary(streaks: RetryStreaks, step: int, count: float, key: str = "cuda:0") -> None:
    streaks.on_boundary(step, {f"{key}/alloc_retries": count, f"{key}/allocated": 1.0})


def test_two_consecutive_steps_with_retries_make_a_streak_and_a_gap_does_not():
    streaks = RetryStreaks()
    for step, count in [(1, 0), (2, 1), (3, 1), (4, 2), (5, 3), (6, 3)]:
        boundary(streaks, step, count)
    # A rank whose two retries came on steps 2 and 5, one apart from each other.
    for step, count in [(1, 0), (2, 1), (3, 1), (5, 2)]:
        boundary(streaks, step, count, "rank1/cuda:1")
    assert streaks.longest() == {"cuda:0": 2, "rank1/cuda:1": 1}
    # A rise over two steps at once cannot say that both retried.
    gap = RetryStreaks()
    for step, count in [(1, 0), (3, 5)]:
        boundary(gap, step, count)
    assert gap.longest() == {"cuda:0": 1}


def test_a_trial_reads_retries_at_each_boundary_and_a_training_run_does_not(stub_cuda, monkeypatch):
    stub_cuda.alloc(0, 100 * MiB)
    monkeypatch.delenv(RETRIES_ENV, raising=False)
    plain = TorchAllocatorBackend(stub_cuda, "cuda")
    values: dict[str, float] = {}
    plain.read(values, full=False)
    assert "cuda:0/alloc_retries" not in values, "memory_stats in every step of training"
    monkeypatch.setenv(RETRIES_ENV, "1")
    trial = TorchAllocatorBackend(stub_cuda, "cuda")
    stub_cuda.retries = 3
    trial.read(values, full=False)
    assert values["cuda:0/alloc_retries"] == 3
    assert stub_cuda.calls == [], "reading must not empty caches or reset peaks"


def test_the_summary_of_a_thrashing_run_says_how_many_steps_in_a_row_retried():
    session = Session()
    for step, count in [(1, 0), (2, 0), (3, 1), (4, 2), (5, 3)]:
        session.submit(Sample(float(step), {"cuda:0/alloc_retries": count}, step))
        session.submit(Marker(float(step), MarkerKind.STEP, step))
    session.submit(Sample(6.0, {"cuda:0/alloc_retries": 9.0}))  # a periodic reading
    data = check_summary(run_summary(session))
    assert data["alloc_retry_steps"] == {"cuda:0": 3}
    assert "alloc_retry_steps" not in run_summary(Session()), "written only where read"


def test_a_trial_that_thrashes_does_not_fit_and_says_why():
    plan = TrialPlan("train.py", (), "--batch-size", device="cuda:0", budget_bytes=80 * GiB)
    summary = {"steps": 5, "peak_bytes": {"cuda:0": 60 * GiB},
               "peak_reserved_bytes": {"cuda:0": 70 * GiB}, "step_time_s": 0.5,
               "alloc_retry_steps": {"cuda:0": 2}}  # fmt: skip
    trial = measured_trial(plan, 512, 0, 0, None, summary, "", 9.0)
    assert trial.ok and not trial.oom and trial.peak_bytes == 70 * GiB
    assert not trial.fits(72 * GiB) and trial.verdict(72 * GiB) == "allocator thrash"
    assert "retried on 2 consecutive steps" in trial.message
    assert trial.to_json()["retry_steps"] == 2
    summary["alloc_retry_steps"] = {"cuda:0": 1}  # one step: a warm-up, not the edge
    assert measured_trial(plan, 512, 0, 0, None, summary, "", 9.0).fits(72 * GiB)


@pytest.mark.parametrize("thrash_from", [700, 900])
def test_the_search_recommends_below_the_sizes_that_thrash(thrash_from):
    # Reserved grows 64 MiB a sample from 8 GiB, with room under the limit up to ~1100;
    # from ``thrash_from`` on, the allocator retries on every step (fragmentation).
    limit = 80 * GiB

    def measure(b: int, role: str, predicted: float | None) -> Trial:
        peak = 8 * GiB + b * 64 * MiB
        retry_steps = 4 if b >= thrash_from else 0
        return Trial(b, peak, ok=True, oom=False, retry_steps=retry_steps)

    result = BatchSearch(measure, limit, 1, 4096).run()
    assert result.recommended is not None and result.recommended < thrash_from
    assert result.recommended >= 0.9 * (thrash_from - 1), result.trials
    assert result.ooms == 0
    assert any(t.thrashed for t in result.trials), "the edge was found by a trial"
    assert len(result.trials) <= 12, [t.batch_size for t in result.trials]
