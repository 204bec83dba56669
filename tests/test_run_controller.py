"""The run lifecycle without a window: runs, stops, stuck runs, abandoning, re-runs."""

from __future__ import annotations

import pytest

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
