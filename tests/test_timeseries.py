"""Bounded time series keep recent samples exactly and every peak of the past."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchmem.timeseries import SeriesBuffer, StepClock


def test_recent_samples_are_kept_in_order():
    buf = SeriesBuffer(recent=5, buckets=4, bucket_width=2)
    for i in range(3):
        buf.append(float(i), float(i * 10))
    t, v = buf.recent()
    assert t.tolist() == [0.0, 1.0, 2.0]
    assert v.tolist() == [0.0, 10.0, 20.0]
    assert buf.last == 20.0 and buf.peak == 20.0 and buf.count == 3


def test_old_samples_fold_into_min_max_buckets_keeping_the_spike():
    buf = SeriesBuffer(recent=10, buckets=8, bucket_width=4)
    values = [1.0] * 40
    values[3] = 999.0  # a one-sample spike that will leave the recent window
    for i, value in enumerate(values):
        buf.append(float(i), value)
    t, v = buf.arrays()
    assert v.max() == 999.0, "the spike must survive decimation"
    recent_t, _ = buf.recent()
    assert recent_t.tolist() == [float(i) for i in range(30, 40)]
    assert np.all(np.diff(t) >= 0), "points come oldest first"


def test_a_day_at_10_hz_stays_bounded_and_keeps_its_peaks():
    buf = SeriesBuffer(recent=600, buckets=256)
    nbytes = buf.nbytes
    n = 24 * 3600 * 10
    rng = np.random.default_rng(0)
    values = rng.normal(1e9, 1e6, n)
    values[12345] = 5e9  # an early transient peak
    values[n - 1000] = 4e9  # a late one
    for i in range(n):
        buf.append(i / 10.0, values[i])
    t, v = buf.arrays()
    assert buf.nbytes == nbytes, "memory must not grow with the run"
    assert len(t) <= 600 + 2 * 256 + 2
    assert v.max() == 5e9 and 4e9 in v
    assert buf.peak == 5e9
    assert t[0] < 3600, "the history still reaches back to the start of the day"


def test_reset_peak_starts_from_the_current_value():
    buf = SeriesBuffer(recent=4, buckets=4)
    for value in (5.0, 50.0, 7.0):
        buf.append(0.0, value)
    buf.reset_peak()
    assert buf.peak == 7.0
    buf.append(1.0, 8.0)
    assert buf.peak == 8.0


def test_invalid_sizes_are_refused():
    with pytest.raises(ValueError):
        SeriesBuffer(recent=1)


def test_step_clock_maps_time_to_steps_and_thins_when_full():
    clock = StepClock(capacity=8)
    for step in range(1, 21):
        clock.add(step * 0.5, step)
    times, _steps = clock.boundaries()
    assert len(times) <= 8
    assert clock.steps == 20
    x = clock.to_steps(np.array([0.0, 5.0, 10.0, 99.0]))
    assert x[0] == 0.0
    assert x[1] == pytest.approx(10.0, abs=1.0)
    assert x[2] == pytest.approx(20.0)
    assert x[3] == 20.0


def test_summary_peaks_list_ranks_in_numeric_order_and_the_total_last():
    from torchmem.events import Sample
    from torchmem.session import Session

    session = Session()
    readings = {f"rank{r}/cpu/rss": float(r) for r in (10, 2, 0, 1)}
    readings["total/cpu/rss"] = 13.0
    readings["cuda:0/allocated"] = 5.0
    session.submit(Sample(0.0, readings))
    peaks = session.peak_bytes()
    assert list(peaks) == [
        "cuda:0",
        "rank0/cpu_rss",
        "rank1/cpu_rss",
        "rank2/cpu_rss",
        "rank10/cpu_rss",
        "total/cpu_rss",
    ]
    assert peaks["rank10/cpu_rss"] == 10.0 and peaks["total/cpu_rss"] == 13.0


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(-1e12, 1e12, allow_nan=False), min_size=0, max_size=400),
    cuts=st.lists(st.integers(0, 400), max_size=6),
    recent=st.integers(2, 40),
    buckets=st.integers(2, 8),
    width=st.integers(1, 5),
)
def test_extend_is_exactly_one_append_per_sample(values, cuts, recent, buckets, width):
    """A reopened recording seeds its series with extend(): what it draws (the envelope
    and the peak) must be what the same samples appended one by one would draw."""
    one = SeriesBuffer(recent, buckets, width)
    many = SeriesBuffer(recent, buckets, width)
    t = np.arange(len(values), dtype=np.float64) * 0.1
    for ti, vi in zip(t, values, strict=True):
        one.append(float(ti), vi)
    bounds = sorted({0, len(values), *(c for c in cuts if c <= len(values))})
    for a, b in itertools.pairwise(bounds):
        many.extend(t[a:b], np.asarray(values[a:b], dtype=np.float64))
    for got, expected in zip(many.arrays(), one.arrays(), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert (many.count, many.bucket_width, many.peak) == (one.count, one.bucket_width, one.peak)
    if values:
        assert (many.last, many.last_t) == (one.last, one.last_t)
