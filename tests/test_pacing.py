"""The small models that pace work inside the training loop, and the job's totals.

Each of them decides something a user sees: how often censuses and boundary readings come
(and so how much monitoring slows training), and the job total drawn beside the ranks.
"""

from __future__ import annotations

import pytest

from torchmem.events import Alert, AlertKind, AlertState, JobMembers, Sample, Severity
from torchmem.probe.step_pace import RECOMPUTE_EVERY, StepPace
from torchmem.series import scope_label, series_label, split_key, split_scope
from torchmem.session import Session
from torchmem.sources.inprocess import BoundaryClock
from torchmem.tensors.schedule import CensusSchedule


def paced(step_s: float, steps: int = 20) -> StepPace:
    pace = StepPace()
    for i in range(steps):
        pace.on_step(i * step_s)
    return pace


# -- StepPace -----------------------------------------------------------------------------
def test_step_pace_is_the_median_so_one_slow_step_does_not_count():
    pace = StepPace()
    t = 0.0
    for i in range(40):
        t += 5.0 if i == 20 else 0.1  # an evaluation pass between two steps
        pace.on_step(t)
    assert pace.step_time == pytest.approx(0.1)


def test_step_pace_follows_a_change_within_a_window_and_forgets_on_reset():
    pace = paced(0.1, 40)
    t = 40 * 0.1
    for _ in range(31 + RECOMPUTE_EVERY):  # a window of slower steps (a bigger batch)
        t += 0.4
        pace.on_step(t)
    assert pace.step_time == pytest.approx(0.4)
    pace.reset()
    assert pace.step_time is None
    pace.on_step(100.0)
    assert pace.step_time is None  # one boundary is no interval


# -- CensusSchedule -----------------------------------------------------------------------
def test_census_schedule_keeps_census_time_under_its_budget():
    schedule = CensusSchedule(pace=paced(0.1), warmup=2)
    assert not schedule.on_step(1)  # warm-up: the first steps allocate everything
    assert schedule.on_step(2)  # the first census measures its own cost
    schedule.record(2, duration_s=0.0495)  # half a step: 1 % needs one every 50 steps
    assert schedule.interval == 50
    assert schedule.overhead <= 0.01
    assert not any(schedule.on_step(s) for s in range(3, 52))
    assert schedule.on_step(52)


def test_census_schedule_fixed_interval_disabled_and_reset():
    fixed = CensusSchedule(every=5, pace=paced(0.1))
    fixed.record(2, 10.0)  # a fixed interval ignores the cost
    assert next(s for s in range(3, 20) if fixed.on_step(s)) == 7
    off = CensusSchedule(enabled=False, pace=paced(0.1))
    assert not any(off.on_step(s) for s in range(100))
    fixed.reset()
    assert fixed.last_step is None and fixed.cost is None
    assert fixed.on_step(3)  # a new run starts with a census again


# -- the boundary clock -------------------------------------------------------------------
def test_boundary_readings_every_step_while_they_are_cheap():
    clock = BoundaryClock(paced(0.1))
    clock.cost(20e-6)  # 20 µs against 100 ms steps
    assert all(clock.due() for _ in range(50))


def test_boundary_readings_thin_out_for_tiny_steps_and_recover_from_one_slow_read():
    clock = BoundaryClock(paced(1e-3))  # 1 ms steps: 1 % is 10 µs
    clock.cost(35e-6)
    due = [clock.due() for _ in range(40)]
    assert sum(due) == 10  # one in every 4 steps
    clock.cost(1.0)  # a page fault, or a garbage collection run inside the reading
    assert clock.read_cost < 1e-3
    for _ in range(5):  # a run of them is not one: the median follows
        clock.cost(0.01)
    assert clock.read_cost == 0.01


# -- a job's totals (derived by the Session) ----------------------------------------------
def test_a_jobs_total_sums_the_latest_readings_once_every_rank_reported():
    session = Session()
    session.submit(JobMembers(0.0, ("rank0", "rank1")))
    session.submit(Sample(1.0, {"cpu/rss": 100.0, "cuda:0/peak_allocated": 7.0}, scope="rank0"))
    assert "total/cpu/rss" not in session.series  # rank 1 has not reported: no total yet
    session.submit(Sample(1.1, {"cpu/rss": 50.0}, scope="rank1"))
    session.submit(Sample(1.2, {"cpu/rss": 120.0}, scope="rank0"))
    assert session.latest()["total/cpu/rss"][0] == 170.0  # rank 0's newest plus rank 1's
    assert session.arrays("total/cpu/rss")[1].tolist() == [150.0, 170.0]
    assert "total/cuda:0/peak_allocated" not in session.series  # peaks are never summed
    # Rank 1 ended: its last reading holds nothing any more, and a late one is left out.
    session.submit(JobMembers(0.0, ("rank0", "rank1"), ended=("rank1",)))
    session.submit(Sample(1.3, {"cpu/rss": 130.0}, scope="rank0"))
    session.submit(Sample(1.3, {"cpu/rss": 999.0}, scope="rank1"))
    assert session.latest()["total/cpu/rss"][0] == 130.0
    assert session.scopes() == ["rank0", "rank1", "total"]


def test_without_a_jobs_members_no_total_is_made_up():
    session = Session()
    session.submit(Sample(1.0, {"cpu/rss": 100.0}, scope="rank0"))
    session.submit(Sample(1.0, {"cpu/rss": 5.0}))
    assert session.keys() == ["rank0/cpu/rss", "cpu/rss"]


def test_a_multi_node_job_gets_a_total_per_machine_that_the_job_total_does_not_count():
    session = Session()
    nodes = {"rank0": "@a", "rank1": "@a", "rank2": "@b"}
    session.submit(JobMembers(0.0, tuple(nodes), nodes))
    session.submit(Sample(1.0, {"cpu/rss": 10.0}, scope="rank0"))
    session.submit(Sample(1.0, {"cpu/rss": 20.0}, scope="rank1"))
    session.submit(Sample(1.1, {"cpu/rss": 5.0}, scope="rank2"))
    latest = session.latest()
    assert latest["@a/cpu/rss"][0] == 30.0 and latest["@b/cpu/rss"][0] == 5.0
    assert latest["total/cpu/rss"][0] == 35.0, "machine totals are not counted again"
    assert series_label("@a/cpu/rss") == "node a process RSS"


def test_listeners_hear_a_ranks_sample_and_the_alert_it_caused_never_a_total_of_their_own():
    """A total is derived where the readings are kept, not submitted: the recorder writes
    the ranks' samples (a reopened job derives its totals again) and hears an alert after
    the sample that raised it."""
    session = Session()
    session.submit(JobMembers(0.0, ("rank0",)))

    def detector(event):
        if isinstance(event, Sample) and session.latest()["total/cpu/rss"][0] > 100:
            alert = Alert(
                event.t,
                "leak:total/cpu/rss",
                AlertKind.LEAK,
                Severity.WARNING,
                AlertState.ACTIVE,
                "total/cpu/rss",
                0,
                1,
                "grows",
                "fix it",
            )
            session.submit(alert)

    session.subscribe(detector)
    heard: list[str] = []
    session.subscribe(
        lambda e: heard.append(",".join(e.series()) if isinstance(e, Sample) else type(e).__name__)
    )
    session.submit(Sample(1.0, {"cpu/rss": 150.0}, scope="rank0"))
    assert heard == ["rank0/cpu/rss", "Alert"]
    assert session.alerts["leak:total/cpu/rss"].state is AlertState.ACTIVE


def test_a_jobs_total_leaves_out_history_from_before_its_members_were_known():
    session = Session()
    session.submit(JobMembers(10.0, ("rank0",)))
    session.submit(
        Sample(5.0, {"cpu/rss": 100.0}, scope="rank0")
    )  # replayed, from before the attach
    assert "total/cpu/rss" not in session.series
    session.submit(Sample(10.5, {"cpu/rss": 100.0}, scope="rank0"))
    assert session.latest()["total/cpu/rss"][0] == 100.0
    session.reset()  # a new run in the window: the old job's members do not carry over
    session.submit(Sample(10.5, {"cpu/rss": 100.0}, scope="rank0"))
    assert "total/cpu/rss" not in session.series


# -- series keys --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "scope", "device", "metric", "label"),
    [
        ("cpu/rss", "", "cpu", "rss", "process RSS"),
        ("cuda:0/allocated", "", "cuda:0", "allocated", "cuda:0 allocated"),
        ("rank1/cpu/rss", "rank1", "cpu", "rss", "rank 1 process RSS"),
        ("pid42/cuda:1/reserved", "pid42", "cuda:1", "reserved", "pid 42 cuda:1 reserved"),
        ("total/system/available", "total", "system", "available", "total system available"),
        ("cpu/some_new_metric", "", "cpu", "some_new_metric", "some_new_metric"),
    ],
)
def test_series_keys_split_and_label(key, scope, device, metric, label):
    got_scope, rest = split_scope(key)
    assert got_scope == scope
    assert split_key(rest) == (device, metric)
    assert series_label(key) == label
    if scope:
        assert scope_label(scope) in label
