"""The run lifecycle without a window: runs, stops, stuck runs, abandoning, re-runs."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QObject, Slot

from torchmem.events import RunStatus
from torchmem.gui.run_controller import RunController
from torchmem.probe.backends import ProcessBackend
from torchmem.session import Session
from torchmem.sources.inprocess import InProcessSource

TIMEOUT_MS = 120_000


@pytest.fixture
def runs(qtbot):
    controller = RunController(InProcessSource(Session(), [ProcessBackend()]))
    yield controller
    assert controller.shutdown(), "every thread ended"


def test_a_run_ends_with_ended_and_a_queued_rerun_follows(qtbot, runs, script_path):
    with qtbot.waitSignal(runs.ended, timeout=TIMEOUT_MS):
        runs.start_script(script_path("ok_print.py"), ["a b"], None, isolated=False)
        assert runs.running and runs.target is runs.source
        runs.queue_rerun()
    assert not runs.running and not runs.stopping
    assert runs.session.run_finished.exit_code == 0
    # The queued re-run is due once the run has ended, not before.
    with qtbot.waitSignal(runs.rerun_due, timeout=1000):
        runs.start_script(script_path("ok_print.py"), [], None, isolated=False)
        runs.queue_rerun()
    qtbot.waitUntil(lambda: not runs.running, timeout=TIMEOUT_MS)


def test_a_stuck_run_is_signalled_and_abandoning_frees_the_controller(qtbot, runs, script_path):
    runs.stuck_after_ms = 300
    runs.start_script(script_path("blocked_in_c.py"), ["4"], None, isolated=False)
    qtbot.waitUntil(
        lambda: any("blocked now" in r.text for r in runs.session.logs), timeout=TIMEOUT_MS
    )
    assert not runs.can_abandon, "nothing to abandon before a stop was asked for"
    with qtbot.waitSignal(runs.stuck_detected, timeout=10_000):
        runs.request_stop()
    assert runs.stuck and runs.can_abandon and runs.stop_waited_s >= 0.3
    runs.abandon()
    assert not runs.running and not runs.stopping and runs.abandoned_alive
    result = runs.session.run_finished
    assert result.status is RunStatus.STOPPED and result.message.startswith("abandoned")
    assert runs.source.abandoned, "the next run must not use this process"
    with qtbot.waitSignal(runs.abandoned_ended, timeout=60_000):
        pass
    assert not runs.abandoned_alive and not runs.source.abandoned
    assert runs.session.run_finished is result, "nothing of the abandoned run came after"


def test_a_timer_that_wakes_early_still_detects_a_stuck_run(qtbot, runs, script_path):
    runs.stuck_after_ms = 400
    runs.start_script(script_path("blocked_in_c.py"), ["4"], None, isolated=False)
    qtbot.waitUntil(
        lambda: any("blocked now" in r.text for r in runs.session.logs), timeout=TIMEOUT_MS
    )
    runs.request_stop()
    runs._stuck_timer.start(50)  # as a coarse timer may: long before the run counts as stuck
    with qtbot.waitSignal(runs.stuck_detected, timeout=5_000):
        pass
    assert runs.stop_waited_s >= 0.4
    runs.abandon()
    qtbot.waitUntil(lambda: not runs.abandoned_alive, timeout=60_000)


class _Failing(Exception):
    pass


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (_Failing("the budget is below the first trial's peak"), "the budget is below"),
        (KeyError("missing"), "the job failed: KeyError: 'missing'"),
        (InterruptedError(), ""),  # a cancel, which needs no words
    ],
)
def test_every_worker_ends_with_finished_and_says_why_it_gave_nothing(qtbot, raised, said):
    from torchmem.gui.workers import Worker, start_in_thread, wait_thread

    class Job(Worker):
        cancelled = (InterruptedError,)
        known = (_Failing,)
        failed_text = "the job failed"

        def work(self):
            raise raised

    class Panel(QObject):  # what a panel does: slots of the GUI thread, queued to it
        def __init__(self):
            super().__init__()
            self.errors, self.results = [], []

        @Slot(str)
        def on_error(self, text):
            self.errors.append(text)

        @Slot(object)
        def on_finished(self, result):
            self.results.append(result)

    job, panel = Job(), Panel()
    job.errored.connect(panel.on_error)
    job.finished.connect(panel.on_finished)
    thread = start_in_thread(job, "torchmem-test-job", job.run, job.finished)
    qtbot.waitUntil(lambda: bool(panel.results), timeout=10_000)
    assert panel.results == [None], "a failed job's thread must still end, with no result"
    assert wait_thread(thread, 5_000)
    errors = panel.errors
    assert len(errors) == (1 if said else 0), errors
    assert not said or errors[0].startswith(said), errors
