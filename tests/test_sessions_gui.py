"""Recorded sessions in the window: every run recorded, listed, reopened as it was."""

from __future__ import annotations

import json

import pytest

from torchmem.gui.dialogs.sessions_dialog import SessionModel, SessionsDialog
from torchmem.record.library import list_sessions, sessions_dir
from torchmem.record.replay import load
from torchmem.report.recorded import recorded_summary

RUN_TIMEOUT_MS = 120_000


def run_to_the_end(qtbot, window, script):
    window.load_script(script, ["20"], run=True)
    qtbot.waitUntil(
        lambda: window.last_result is not None and not window.running, timeout=RUN_TIMEOUT_MS
    )
    window.recordings.recorder.wait_closed()


@pytest.fixture
def recorded(qtbot, make_window, script_path):
    """A window that ran train_steps.py once, and what its views showed live."""
    window = make_window()
    run_to_the_end(qtbot, window, script_path("train_steps.py"))
    keys = window.session.keys()
    live = {
        "traces": {k: window.session.arrays(k) for k in keys},
        "samples": window.session.samples,
        "steps": window.session.steps.steps,
        "peaks": window.session.peak_bytes(),
        "markers": [m.label for m in window.session.user_markers()],
    }
    return window, live


def test_a_run_in_the_window_is_recorded_and_reopens_with_the_same_figures(qtbot, recorded):
    window, live = recorded
    (entry,) = list_sessions(sessions_dir())
    assert entry.status == "finished" and entry.title == "train_steps.py"
    data = recorded_summary(load(entry.path))
    assert data["steps"] == live["steps"] == 20
    assert data["recording"]["complete"] is True

    dialog = SessionsDialog(window)
    qtbot.addWidget(dialog)
    assert dialog.model.rowCount() == 1
    with qtbot.waitSignal(dialog.open_requested) as opened:
        dialog.open_selected()
    window.session.reset()  # what was live is gone; only the file can bring it back
    assert window.recordings.open(opened.args[0])
    # Every trace point as it was drawn live: same times, same values.
    assert window.session.keys() == list(live["traces"])
    for key, (t, v) in live["traces"].items():
        t_again, v_again = window.session.arrays(key)
        assert t_again.tolist() == t.tolist() and v_again.tolist() == v.tolist(), key
    assert window.session.steps.steps == live["steps"]
    assert window.session.peak_bytes() == live["peaks"]
    assert [m.label for m in window.session.user_markers()] == live["markers"]
    assert "recorded" in window.windowTitle()
    assert window.run_label.text().startswith("Finished (exit code 0)")
    assert len(list_sessions(sessions_dir())) == 1, "showing a recording records nothing"


def test_the_sessions_model_is_a_well_behaved_qt_model(qtmodeltester, recorded):
    model = SessionModel()
    model.set_rows(list_sessions(sessions_dir()))
    qtmodeltester.check(model)


def test_a_damaged_file_leaves_the_views_as_they_were(recorded, tmp_path):
    window, live = recorded
    bad = tmp_path / "bad.tmsession"
    bad.write_bytes(b"not a session" * 50)
    assert not window.recordings.open(str(bad))
    assert "Cannot open the recording" in window.banner.text()
    assert "not a torchmem session" in window.banner.text()
    assert window.session.samples == live["samples"]


def test_runs_are_not_recorded_when_recording_is_off(qtbot, make_window, script_path):
    window = make_window()
    window.act_record.trigger()  # on by default: this turns it off
    assert not window.recordings.recorder.enabled
    run_to_the_end(qtbot, window, script_path("train_steps.py"))
    assert list_sessions(sessions_dir()) == []
    assert window.settings.value("record/enabled") in (False, "false")


def test_two_recorded_runs_open_side_by_side(qtbot, make_window, script_path):
    window = make_window()
    for _ in range(2):
        run_to_the_end(qtbot, window, script_path("train_steps.py"))
    dialog = SessionsDialog(window)
    qtbot.addWidget(dialog)
    assert not dialog.compare_button.isEnabled(), "one row selected: nothing to compare"
    dialog.view.selectAll()
    assert dialog.compare_button.isEnabled() and not dialog.open_button.isEnabled()
    with qtbot.waitSignal(dialog.compare_requested) as asked:
        dialog.compare_selected()
    compare = window.recordings.compare(asked.args[0])
    qtbot.addWidget(compare)
    assert compare.table.rowCount() == 2
    names = [compare.table.item(r, 0).text() for r in range(2)]
    assert all(n.startswith("train_steps.py") for n in names)
    assert names[0] != names[1], "two runs of one script are told apart (by date here)"
    columns = range(compare.table.columnCount())
    assert all(compare.table.horizontalHeaderItem(c).toolTip() for c in columns), (
        "every column says what its figure is"
    )
    assert compare.series_combo.count() >= 1
    curves = compare.plot.getPlotItem().listDataItems()
    assert len(curves) == 2 and all(len(c.getData()[0]) > 0 for c in curves)
    compare.axis_combo.setCurrentIndex(1)  # by training step
    xs = [c.getData()[0] for c in compare.plot.getPlotItem().listDataItems()]
    assert all(x.max() <= 20.0 + 1e-9 for x in xs), "20 steps each, on a step axis"


def test_the_shown_run_exports_as_csv_png_svg_and_json(qtbot, recorded, tmp_path):
    window, live = recorded
    for name in ("run.csv", "run.png", "run.svg", "run.json"):
        assert window.recordings.export_to(str(tmp_path / name)), name
        assert name in window.statusBar().currentMessage()
    rows = (tmp_path / "run.csv").read_text().splitlines()
    assert len(rows) - 1 == live["samples"], "every sample of the run, from its session file"
    assert "cpu/rss" in rows[0].split(",")
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (tmp_path / "run.svg").read_text()[:2000]
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["steps"] == live["steps"] and summary["status"] == "finished"
    bad = tmp_path / "missing-folder" / "run.csv"
    assert not window.recordings.export_to(str(bad))
    assert "Cannot export" in window.banner.text()


@pytest.mark.slow
def test_allocator_settings_reach_a_separate_process_and_its_recording(
    qtbot, make_window, tmp_path, monkeypatch
):
    from PySide6.QtWidgets import QInputDialog

    script = tmp_path / "alloc_conf.py"
    script.write_text(
        "import os, torch\n"
        "print('conf=' + os.environ.get('PYTORCH_CUDA_ALLOC_CONF', ''), flush=True)\n"
        "model = torch.nn.Linear(8, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(5):\n"
        "    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()\n"
    )
    window = make_window()
    answers = iter([("max_split_size_mb:5", True), (" expandable_segments:True ", True)])
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: next(answers))
    window.edit_allocator_settings()
    assert "max_split_size_mb must be a whole number of MiB (at least 20)" in window.banner.text()
    assert window.allocator_conf == ""
    window.edit_allocator_settings()
    assert window.allocator_conf == "expandable_segments:True"
    assert window.mode_label.text() == "Separate process · expandable_segments:True"
    window.load_script(str(script), [], run=True)
    qtbot.waitUntil(
        lambda: window.last_result is not None and not window.running, timeout=RUN_TIMEOUT_MS
    )
    window.recordings.recorder.wait_closed()
    assert window.session.run_started.mode == "isolated"
    assert "conf=expandable_segments:True" in window.log.toPlainText()
    (entry,) = list_sessions(sessions_dir())
    assert entry.meta["allocator"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_two_censuses_of_the_shown_run_compare_in_a_dialog(qtbot, make_window, tmp_path):
    from helpers import census_of

    from torchmem.events import CensusTaken, RunStarted
    from torchmem.record.recorder import start_recording
    from torchmem.session import Session

    path = tmp_path / "leaky.tmsession"
    live = Session()
    recorder = start_recording(path, live, "run", "leaky.py")
    live.submit(RunStarted(0.0, "leaky.py", ()))
    live.submit(CensusTaken(1.0, 10, census_of({"w": [4096], "history[*]": [100] * 2}, 10)))
    live.submit(CensusTaken(2.0, 20, census_of({"w": [4096], "history[*]": [100] * 9}, 20)))
    recorder.close()
    window = make_window()
    assert window.recordings.compare_censuses() is None, "nothing shown yet"
    assert "Two censuses are needed" in window.banner.text()
    assert window.recordings.open(str(path))
    dialog = window.recordings.compare_censuses()
    qtbot.addWidget(dialog)
    assert dialog.before.count() == 2 and dialog.after.currentIndex() == 1
    assert dialog.table.rowCount() == 1
    row = [dialog.table.item(0, c).text() for c in range(6)]
    assert row[:2] == ["grown", "history[*]"] and row[4] == "900 B ×9" and row[5] == "+700 B"
    dialog.after.setCurrentIndex(0)
    assert dialog.table.rowCount() == 0, "a census against itself: nothing changed"


def test_record_names_the_file_of_the_next_run_even_with_recording_off(
    qtbot, make_window, script_path, tmp_path
):
    window = make_window()
    window.recordings.toggle(False)  # Run > Record every run: off
    chosen = tmp_path / "chosen.tmsession"
    window.recordings.recorder.next_path = chosen  # what `torchmem --record FILE` sets
    run_to_the_end(qtbot, window, script_path("train_steps.py"))
    assert recorded_summary(load(chosen))["steps"] == 20
    run_to_the_end(qtbot, window, script_path("train_steps.py"))  # once only: off again
    assert list_sessions(sessions_dir()) == []


@pytest.mark.slow
def test_record_on_the_command_line_is_checked_before_a_window_opens(tmp_path):
    import subprocess
    import sys

    taken = tmp_path / "taken.tmsession"
    taken.write_bytes(b"")
    r = subprocess.run(
        [sys.executable, "-m", "torchmem", "--record", str(taken), "x.py"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "already exists" in r.stderr


def test_runs_of_a_job_compare_with_readable_peaks_in_rank_order(qtbot, tmp_path):
    """The compare table named a job's peaks "rank10/cpu_rss" and put rank 10 before 2."""
    from torchmem.events import JobMembers, RunStarted, Sample
    from torchmem.gui.windows.compare_window import CompareWindow
    from torchmem.record.recorder import start_recording
    from torchmem.session import Session

    ranks = ("rank0", "rank2", "rank10")
    recordings = []
    for name in ("before", "after"):
        live = Session()
        path = tmp_path / f"{name}.tmsession"
        recorder = start_recording(path, live, "run", f"/x/{name}.py")
        live.submit(RunStarted(0.0, f"/x/{name}.py", ()))
        live.submit(JobMembers(0.0, ranks))
        for t in (1.0, 2.0):
            for rank in ranks:
                live.submit(Sample(t, {"cpu/rss": 1e8 * t}, scope=rank))
        recorder.close()
        recordings.append(load(path))
    compare = CompareWindow(recordings)
    qtbot.addWidget(compare)
    headers = [
        compare.table.horizontalHeaderItem(c).text() for c in range(compare.table.columnCount())
    ]
    peaks = [h for h in headers if h.startswith("Peak ")]
    assert peaks == ["Peak rank 0 RSS", "Peak rank 2 RSS", "Peak rank 10 RSS", "Peak total RSS"]
