"""Attach, detach and isolated runs in the window, as a user drives them."""

from __future__ import annotations

import pytest
from conftest import SCRIPTS
from helpers import holder_text
from PySide6.QtCore import Qt
from test_agent import start, wait_for_agent
from test_gui import RUN_TIMEOUT_MS, finish, log_text

from torchmem.events import RunStatus
from torchmem.gui.dialogs.attach_dialog import AttachDialog, ProcessModel

# Starts torchmem, agent or training processes (conftest checks the mark).
pytestmark = pytest.mark.slow


@pytest.fixture
def served_proc(runtime_dir):
    proc = start([str(SCRIPTS / "served_train.py"), "--sleep", "0.02"])
    wait_for_agent(proc)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def test_attach_shows_steps_and_censuses_then_stop_asks_and_ends_the_run(
    qtbot, make_window, served_proc, monkeypatch
):
    window = make_window()
    assert window.attach(served_proc.pid)
    qtbot.waitUntil(lambda: "Attached to pid" in window.run_label.text(), timeout=30_000)
    qtbot.waitUntil(lambda: window.session.steps.steps >= 10, timeout=30_000)
    assert window.act_detach.isEnabled() and not window.act_run.isEnabled()
    assert "cpu/rss" in window.plot.curve_keys()
    assert f"pid {served_proc.pid}" in window.windowTitle()

    window.act_census.trigger()
    qtbot.waitUntil(lambda: window.tensors.model.census is not None, timeout=30_000)
    census = window.tensors.model.census
    buffer = next(t for t in census.tensors() if t.name == "served_buffer")
    assert "served_buffer" in holder_text(qtbot, window, buffer)

    # Stop asks first: a "No" leaves the attached run going (someone's week-long training).
    from PySide6.QtWidgets import QMessageBox

    asked = []
    answer = QMessageBox.No
    monkeypatch.setattr(
        QMessageBox, "question", lambda *a, **k: asked.append(a) or answer, raising=True
    )
    window.act_stop.trigger()  # as the toolbar button and Shift+F5 do
    assert len(asked) == 1, "Stop on an attached run must ask first"
    steps = window.session.steps.steps
    qtbot.waitUntil(lambda: window.session.steps.steps >= steps + 5, timeout=30_000)
    assert served_proc.poll() is None and window.running
    answer = QMessageBox.Yes
    window.act_stop.trigger()
    assert len(asked) == 2
    result = finish(qtbot, window)
    assert result.status is RunStatus.STOPPED, log_text(window)
    assert "Stopped" in window.run_label.text()
    assert window.attached is None and window.runs.target is window.source
    served_proc.wait(timeout=30)


def test_detach_leaves_the_process_running(qtbot, make_window, served_proc):
    window = make_window()
    window.attach(served_proc.pid)
    qtbot.waitUntil(lambda: window.session.steps.steps >= 3, timeout=30_000)
    window.act_detach.trigger()
    qtbot.waitUntil(lambda: not window.running, timeout=10_000)
    assert "Detached" in window.run_label.text()
    assert served_proc.poll() is None, "detaching never stops the script"
    assert window.act_attach.isEnabled() and window.act_run.isEnabled() is False  # no script
    # What the window showed is recorded, and reads back as a detach, not a crash.
    from torchmem.record.library import list_sessions, sessions_dir
    from torchmem.record.replay import load
    from torchmem.report.recorded import recorded_summary

    window.recordings.recorder.wait_closed()
    (entry,) = list_sessions(sessions_dir())
    assert entry.status == "detached"
    data = recorded_summary(load(entry.path))
    assert data["steps"] >= 3 and "detached" in data["message"]
    # Reopened in the window: a detach, not "killed or crashed ... stopped from outside".
    assert window.recordings.open(str(entry.path))
    shown = window.run_label.text() + window.run_label.toolTip() + window.banner.text()
    assert "Detached" in window.run_label.text(), shown
    assert "killed" not in shown and "from outside" not in shown


def test_attach_without_agent_watches_from_outside_and_says_what_is_missing(
    qtbot, make_window, runtime_dir
):
    proc = start(["-c", "import time, torch; time.sleep(60)"])
    try:
        window = make_window()
        window.attach(proc.pid)
        qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=30_000)
        assert "watched from outside" in window.banner.text()
        qtbot.waitUntil(lambda: window.session.samples >= 3, timeout=30_000)
        window.run_command("gc_collect")
        qtbot.waitUntil(lambda: "has no agent" in log_text(window), timeout=10_000)
        window.stop()  # cannot stop a process without an agent: it says so
        assert "cannot stop it" in window.banner.text()
        proc.kill()
        proc.wait()
        qtbot.waitUntil(lambda: not window.running, timeout=10_000)
        assert f"process {proc.pid} exited" in log_text(window)
        # Killed from outside: only its parent saw how. Never "Finished (exit code 0)".
        assert window.run_label.text().startswith("Ended (exit status unknown)"), (
            window.run_label.text()
        )
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_attach_to_a_missing_pid_is_an_error_message(qtbot, make_window, runtime_dir):
    window = make_window()
    window.attach(999_999_999)
    qtbot.waitUntil(lambda: not window.running, timeout=10_000)
    assert "Cannot attach: no process with pid 999999999" in window.banner.text()


def test_isolated_run_handles_signals_and_survives_a_segfault(
    qtbot, make_window, script_path, runtime_dir
):
    window = make_window()
    window.act_isolated.trigger()
    assert window.settings.value("run/isolated") in (True, "true"), "remembered"
    window.load_script(script_path("uses_signal.py"), [], run=True)
    result = finish(qtbot, window)
    assert result.status is RunStatus.FINISHED and result.exit_code == 0, log_text(window)
    assert "installed a handler" in log_text(window), "the child's output reaches the log"

    window.load_script(script_path("segfault.py"), [], run=True)
    result = finish(qtbot, window)
    assert result.status is RunStatus.FAILED
    assert "killed by SIGSEGV" in result.message
    assert "about to crash" in log_text(window)
    assert window.isVisible(), "the window lives on"


def test_an_isolated_runs_worker_processes_and_c_code_reach_the_log_once(
    qtbot, make_window, script_path, runtime_dir
):
    """In a child process, the agent forwards what the script prints; a DataLoader worker,
    a spawned process (mp.spawn's ranks) and C code write to the child's terminal, which
    went to /dev/null. Every line now reaches the Log pane, each once, whole."""
    window = make_window()
    window.act_isolated.setChecked(True)
    window.load_script(script_path("workers_print.py"), [], run=True)
    result = finish(qtbot, window)
    assert result.status is RunStatus.FINISHED, log_text(window)
    lines = log_text(window).splitlines()
    for line in (
        "hello from the script",
        "hello from loader worker 0",
        "hello from spawned rank 1",
        "hello from C code",
        "the script ends",
    ):
        assert lines.count(line) == 1, (line, lines)
    assert lines.index("hello from the script") < lines.index("the script ends")


def test_isolated_run_stops_on_request(qtbot, make_window, script_path, runtime_dir):
    window = make_window()
    window.act_isolated.setChecked(True)
    window.load_script(script_path("train_forever.py"), [], run=True)
    qtbot.waitUntil(lambda: window.session.steps.steps >= 3, timeout=RUN_TIMEOUT_MS)
    window.stop()
    result = finish(qtbot, window)
    assert result.status is RunStatus.STOPPED and result.exit_code == 130


def test_a_separate_process_blocked_in_sleep_is_stopped_and_says_so(
    qtbot, make_window, script_path, runtime_dir
):
    window = make_window()
    window.act_isolated.setChecked(True)
    window.load_script(script_path("blocked_in_c.py"), ["60"], run=True)
    qtbot.waitUntil(lambda: "blocked now" in log_text(window), timeout=RUN_TIMEOUT_MS)
    window.stop()
    result = finish(qtbot, window)
    assert result.status is RunStatus.STOPPED
    # Not "Run the process was killed by SIGTERM.": who stopped it, how, and why.
    assert result.message.startswith("stopped by the user: ended by SIG"), result.message
    assert window.banner.text().startswith("Stopped by the user: ended by SIG")
    assert "7 s" in window.act_stop.toolTip(), "the tooltip says how long it may take"


def test_attach_dialog_lists_agents(qtbot, served_proc, qtmodeltester):
    dialog = AttachDialog()
    qtbot.addWidget(dialog)
    qtbot.waitUntil(
        lambda: any(r.pid == served_proc.pid for r in dialog.model.rows), timeout=20_000
    )
    row = next(i for i, r in enumerate(dialog.model.rows) if r.pid == served_proc.pid)
    model: ProcessModel = dialog.model
    assert model.index(row, 1).data() == "yes"
    assert "served_train.py" in model.index(row, 5).data()
    qtmodeltester.check(model)
    dialog.table.selectRow(row)
    assert dialog.attach_button.isEnabled()
    dialog.accept()
    assert dialog.chosen_pid == served_proc.pid


def test_inject_turns_an_outside_watch_into_a_full_attach(qtbot, make_window, runtime_dir):
    from torchmem.transport.inject import gdb_unsafe_here

    unsafe = gdb_unsafe_here()
    if unsafe:
        pytest.skip(f"no injection here: {unsafe}")
    proc = start([str(SCRIPTS / "plain_train.py")])
    try:
        assert proc.stdout.readline().strip() == "training"
        window = make_window()
        window.attach(proc.pid)
        qtbot.waitUntil(lambda: window.act_inject.isEnabled(), timeout=30_000)
        window.act_inject.trigger()
        qtbot.waitUntil(
            lambda: (
                (window.attached is not None and window.attached.has_agent)
                or "Cannot attach" in window.banner.text()
            ),
            timeout=60_000,
        )
        if "does not let this process trace" in window.banner.text():
            pytest.skip("ptrace refused here")
        qtbot.waitUntil(lambda: window.session.steps.steps >= 3, timeout=30_000)
        assert window.attached.injected
        assert "injecting the agent" in log_text(window)
        window.detach()
        qtbot.waitUntil(lambda: not window.running, timeout=10_000)
    finally:
        proc.kill()
        proc.communicate()


def test_a_leak_in_an_isolated_run_is_one_alert_from_its_agent(qtbot, make_window, runtime_dir):
    from conftest import ROOT

    window = make_window()
    window.act_isolated.setChecked(True)
    window.load_script(str(ROOT / "tests" / "leak_corpus" / "leak_features_list.py"), [], run=True)
    result = finish(qtbot, window)
    assert result.exit_code == 0, log_text(window)
    leaks = [a for a in window.session.alert_list() if a.kind == "leak"]
    assert len({a.key for a in leaks}) == 1, [a.key for a in leaks]
    alert = leaks[0]
    assert "features" in alert.message, "the agent's culprits name the list"
    assert not window.source.leaks._trends, "the window's own detector heard nothing"


def test_an_error_while_following_ends_the_attach_and_says_so(
    qtbot, make_window, runtime_dir, monkeypatch
):
    """Every worker ends with finished: a watch whose process vanishes oddly never leaves
    the window stuck on "attached"."""
    from torchmem.sources.attached import AttachedRun

    def vanished(self, *args, **kwargs):
        raise RuntimeError("the process table changed under us")

    monkeypatch.setattr(AttachedRun, "follow", vanished)
    proc = start(["-c", "import time, torch; time.sleep(60)"])
    try:
        window = make_window()
        window.attach(proc.pid)
        qtbot.waitUntil(lambda: not window.running, timeout=30_000)
        assert "error of its own" in window.banner.text()
        assert "the process table changed" in window.banner.text()
        assert window.act_attach.isEnabled() and window.attached is None
    finally:
        proc.kill()
        proc.communicate()


def test_a_node_that_stops_reporting_is_said_once_and_reconnect_attaches_again(
    qtbot, make_window, monkeypatch
):
    """A multi-node job over SSH: the status line counts the nodes reporting, a node lost
    is said once in the banner with Reconnect, and Reconnect attaches again to the same
    hosts (after detaching, when still attached)."""

    class Node:
        def __init__(self, target: str) -> None:
            self.target = target

    class Job:  # an AttachedRun of two SSH hosts, one of which went quiet
        label = "2 nodes"
        hosts = [Node("node1"), Node("node2")]

        def reporting(self):
            return 1, 2

        def lost_hosts(self):
            return ["node2"]

    window = make_window()
    attaching = window.attaching
    attaching.ssh = (None, Job.hosts)
    monkeypatch.setattr(window.runs, "attached", Job())
    shown = []
    original = window.banner.show_message
    monkeypatch.setattr(
        window.banner, "show_message", lambda *a: (shown.append(a[0]), original(*a))
    )
    assert attaching.nodes_text() == " · 1 of 2 nodes reporting"
    assert attaching.nodes_text() == " · 1 of 2 nodes reporting"
    assert len(shown) == 1, "a lost node is said once"
    assert "Lost the SSH connection to node2" in window.banner.text()
    assert "The other nodes go on" in window.banner.text()
    assert window.banner.action_button.text() == "Reconnect"
    assert "node1, node2" in window.banner.action_button.toolTip()

    again = []
    monkeypatch.setattr(attaching, "attach", lambda pid, **kw: again.append((pid, kw)) or True)
    detached = []
    monkeypatch.setattr(window.runs, "detach", lambda: detached.append(True))
    monkeypatch.setattr(type(window), "running", property(lambda self: not detached))
    window.banner.action_button.click()  # still attached: detach first, attach once ended
    assert detached and not again
    attaching.on_run_ended()
    qtbot.waitUntil(lambda: bool(again))
    assert again == [(None, {"hosts": Job.hosts})]


def test_return_in_the_attach_dialog_attaches_to_the_selected_process(qtbot, served_proc):
    from PySide6.QtWidgets import QDialog

    for where in ("machine field", "table"):
        dialog = AttachDialog()
        qtbot.addWidget(dialog)
        dialog.show()
        qtbot.waitUntil(lambda d=dialog: d.selected_pid() is not None, timeout=20_000)
        row = next(i for i, r in enumerate(dialog.model.rows) if r.pid == served_proc.pid)
        dialog.table.selectRow(row)
        target = dialog.host_combo.lineEdit() if where == "machine field" else dialog.table
        qtbot.keyClick(target, Qt.Key_Return)
        assert dialog.result() == QDialog.Accepted, where
        assert dialog.chosen_pid == served_proc.pid
