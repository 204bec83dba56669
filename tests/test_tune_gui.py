"""The Tune panel, driven as a user would: fill the form, Start, watch, use the result."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
from helpers import check_summary

from torchmem.gui.panels.tune_panel import TunePanel

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
LINEAR = str(SCRIPTS / "linear_memory.py")
SEARCH_TIMEOUT_MS = 180_000


@pytest.fixture
def panel(qtbot):
    panel = TunePanel()
    qtbot.addWidget(panel)
    panel.resize(1100, 600)
    yield panel
    assert panel.shutdown()


def fill(panel, script=LINEAR, budget="700 MiB", args=""):
    panel.script_edit.setText(script)
    panel.args_edit.setText(args)
    panel.budget_edit.setText(budget)


def test_a_search_fills_plot_and_table_live_and_its_result_can_be_used(qtbot, panel, tmp_path):
    fill(panel)
    seen: list[int] = []
    panel.table.model().rowsInserted.connect(lambda *_: seen.append(panel.table.rowCount()))
    assert panel.start()
    assert not panel.start_button.isEnabled() and panel.cancel_button.isEnabled()
    assert not panel.budget_edit.isEnabled()  # the form is frozen while it runs
    qtbot.waitUntil(lambda: not panel.running, timeout=SEARCH_TIMEOUT_MS)
    result = panel.result
    assert result is not None, panel.status.text()
    # Filled trial by trial, not at the end.
    assert seen == list(range(1, len(result.trials) + 1))
    assert panel.table.rowCount() == len(result.trials) >= 3
    assert len(panel.plot.ok_points.data) == sum(t.ok for t in result.trials)
    assert len(panel.plot.fit_curve.getData()[0]) > 10  # the model, drawn out to the budget
    assert panel.plot.pick_line.isVisible() and panel.plot.limit_line.isVisible()
    assert f"{result.recommended:,}" in panel.headline.text()
    assert "Recommended --batch-size" in panel.status.text()
    assert panel.progress.value() == len(result.trials)
    # A fake step predicted the model first: one probe to scale it, then the verification
    # and its repeat (the noise of identical runs, where the answer is decided).
    assert panel.prediction is not None and panel.prediction.fit is not None
    assert len(result.trials) <= 4, [t.batch_size for t in result.trials]
    # "Use this batch size": the script and its arguments, with the size filled in.
    with qtbot.waitSignal(panel.use_batch_size) as used:
        panel.use_button.click()
    script, args = used.args
    assert script == LINEAR and args == ["--batch-size", str(result.recommended)]
    # Exports: the same summary as `torchmem tune --summary`, a CSV and a PNG.
    panel.export(str(tmp_path / "t.json"))
    data = check_summary(json.loads((tmp_path / "t.json").read_text()))
    assert data["recommended"] == result.recommended and data["kind"] == "tune"
    panel.export(str(tmp_path / "t.csv"))
    assert (tmp_path / "t.csv").read_text().count("\n") == len(result.trials) + 1
    panel.export(str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 5000


def test_cancel_in_the_middle_leaves_no_process_and_a_usable_panel(qtbot, panel):
    fill(panel, budget="4 GiB", args="--steps 100000")
    panel.steps_spin.setValue(1000)  # a trial that would run for minutes
    me = psutil.Process()

    def trial_running():
        return any("linear_memory" in " ".join(c.cmdline()) for c in me.children(recursive=True))

    assert panel.start()
    qtbot.waitUntil(trial_running, timeout=60_000)
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: not panel.running, timeout=30_000)
    assert not trial_running()
    assert "cancelled" in panel.status.text()
    assert panel.start_button.isEnabled() and panel.budget_edit.isEnabled()


@pytest.mark.parametrize(
    ("script", "budget", "batch", "message"),
    [
        (str(SCRIPTS / "missing.py"), "1 GiB", "--batch-size", "missing.py"),
        (LINEAR, "a lot", "--batch-size", "not a size"),
        (LINEAR, "1 GiB", "", "batch-size option"),
    ],
)
def test_bad_input_is_said_in_red_and_starts_nothing(qtbot, panel, script, budget, batch, message):
    fill(panel, script=script, budget=budget)
    panel.batch_edit.setText(batch)
    assert not panel.start()
    assert message in panel.status.text() and "c0392b" in panel.status.styleSheet()
    assert not panel.running and panel.start_button.isEnabled()


def test_a_step_function_is_tuned_by_file_and_name_and_its_call_is_copied(qtbot, panel):
    fill(panel, script=f"{SCRIPTS / 'step_functions.py'}:linear_step")
    panel.batch_edit.clear()  # a function takes the size as its argument: no option needed
    panel.max_spin.setValue(64)  # 64 MiB at the top: clearly more than the noise
    assert panel.start(), panel.status.text()
    assert "linear_step" in panel.status.text()
    qtbot.waitUntil(lambda: not panel.running, timeout=SEARCH_TIMEOUT_MS)
    result = panel.result
    assert result is not None, panel.status.text()
    assert result.recommended == 64 and all(t.steps == 4 for t in result.trials)
    assert f"Recommended batch size {result.recommended}" in panel.status.text()
    assert not panel.use_button.isEnabled()  # no command line to fill in
    panel.copy_button.click()
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == f"linear_step({result.recommended})"


def test_a_budget_below_batch_size_one_is_reported_and_the_panel_stays_usable(qtbot, panel):
    fill(panel, budget="60 MiB")
    assert panel.start()
    qtbot.waitUntil(lambda: not panel.running, timeout=SEARCH_TIMEOUT_MS)
    assert panel.result is None
    assert "batch size 1 does not fit" in panel.status.text()
    assert panel.table.rowCount() == 1 and len(panel.plot.fail_points.data) == 1
    assert panel.start_button.isEnabled()


def test_the_window_opens_the_panel_on_its_script_and_takes_the_result_back(qtbot, make_window):
    window = make_window()
    window.load_script(LINEAR, ["--steps", "50", "--batch-size", "8"])
    window.act_tune.trigger()  # Run > Tune the batch size… (Ctrl+B)
    assert window.tune_dock.isVisible()
    # The window's script, its other arguments; the batch option is the search's to set.
    assert window.panels.tune.script_edit.text() == str(Path(LINEAR).resolve())
    assert window.panels.tune.args_edit.text() == "--steps 50"
    window.panels.tune.use_batch_size.emit(LINEAR, ["--steps", "50", "--batch-size", "384"])
    assert window.script_args == ["--steps", "50", "--batch-size", "384"]
    assert window.args_edit.text() == "--steps 50 --batch-size 384"
    assert "F5 runs the script" in window.statusBar().currentMessage()
    assert window.run_label.text().startswith("Ready: linear_memory.py")


def test_on_an_accelerator_allocated_is_drawn_beside_reserved(qtbot, panel):
    from torchmem.tuning.search import BatchSearch, Trial
    from torchmem.tuning.trial import TrialPlan

    MiB, GiB = 1 << 20, 1 << 30

    def measure(b, role, predicted):  # what run_trial reports of a CUDA trial
        return Trial(b, 2 * GiB + 15 * MiB * b, ok=True, oom=False,
                     peak_allocated_bytes=2 * GiB + 10 * MiB * b,
                     peak_reserved_bytes=2 * GiB + 15 * MiB * b)  # fmt: skip

    panel.plan = TrialPlan("train.py", (), "--batch-size", 3, "cuda:0", 20 * GiB)
    panel.limit = 18 * GiB
    result = BatchSearch(measure, panel.limit).run()
    panel.trials, panel.fit, panel.result = result.trials, result.fit, result
    panel._redraw()
    drawn = panel.plot
    assert len(drawn.alloc_points.data) == len(drawn.ok_points.data) == len(result.trials)
    assert all(a["y"] < r["y"] for a, r in zip(drawn.alloc_points.data, drawn.ok_points.data,
                                                strict=True))  # fmt: skip
    assert len(panel.plot.alloc_curve.getData()[0]) > 10  # its own model, dotted


def test_a_torchrun_job_is_tuned_per_rank_from_the_panel(qtbot, panel):
    ddp = str(SCRIPTS / "ddp_train.py")
    fill(panel, script=ddp, budget="3 GiB", args="--sleep 0 --mib-per-sample 128")
    panel.ranks_spin.setValue(2)
    panel.max_spin.setValue(2)  # two sizes: the path end to end, not the search again
    assert panel.start(), panel.status.text()
    assert "torchrun, 2 processes" in panel.status.text()
    qtbot.waitUntil(lambda: not panel.running, timeout=SEARCH_TIMEOUT_MS)
    result = panel.result
    assert result is not None, panel.status.text()
    # 128 MiB a sample a rank: a rise the noise of two loaded processes cannot hide.
    assert result.recommended == 2 and all(t.ranks == 2 and t.ok for t in result.trials), (
        [(t.batch_size, t.role, t.peak_bytes, t.ok, t.ranks, t.message) for t in result.trials],
        result.limit_bytes,
        result.notes,
    )
    # The batch is per rank: "Use this batch size" fills the user's script, not torchrun.
    with qtbot.waitSignal(panel.use_batch_size) as used:
        panel.use_button.click()
    assert used.args == [ddp, ["--sleep", "0", "--mib-per-sample", "128", "--batch-size", "2"]]
    panel.copy_button.click()
    from PySide6.QtGui import QGuiApplication

    copied = QGuiApplication.clipboard().text()
    assert "torch.distributed.run --nproc_per_node=2" in copied
    assert copied.endswith("ddp_train.py --sleep 0 --mib-per-sample 128 --batch-size 2")
    # A step function runs in one process: asking for two says so.
    fill(panel, script=f"{SCRIPTS / 'step_functions.py'}:linear_step")
    assert not panel.start()
    assert "tuned in one process" in panel.status.text()


def test_the_empty_plot_shows_the_forms_range_and_budget(panel):
    # Before a search: batch sizes along x and zero to the budget up y, in the budget's
    # unit, not pyqtgraph's "-400...400 (x0.001)" around nothing.
    fill(panel, budget="700 MiB")
    panel.budget_edit.editingFinished.emit()
    item = panel.plot.getPlotItem()
    (x0, x1), (y0, y1) = item.viewRange()
    assert -0.1 * y1 <= y0 <= 0 and 700 <= y1 <= 800  # pyqtgraph pads the range a little
    assert "MiB" in item.getAxis("left").labelText
    ticks = [label for _, label in item.getAxis("bottom")._tickLevels[0]]
    assert ticks[0] == "1" and f"{panel.max_spin.value():,}" in ticks
    assert x0 < 0 < 12 < x1
