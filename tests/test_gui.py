"""The window, driven as a user would: run, watch, press buttons, stop, fail, close."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QGraphicsItem

from torchmem.events import RunStatus, Sample
from torchmem.gui.bridge import REDRAW_HZ
from torchmem.gui.theme import apply_theme
from torchmem.probe.backends import ProcessBackend, TorchAllocatorBackend
from torchmem.resources import demo_script

RUN_TIMEOUT_MS = 120_000


@pytest.fixture
def window(make_window):
    return make_window()


def finish(qtbot, window):
    qtbot.waitUntil(
        lambda: window.last_result is not None and not window.running, timeout=RUN_TIMEOUT_MS
    )
    return window.last_result


def log_text(window):
    return window.log.toPlainText()


def test_demo_runs_and_its_memory_is_drawn(qtbot, window):
    window.load_script(
        str(demo_script()), ["--epochs", "2", "--steps", "8", "--batch-size", "8"], run=True
    )
    result = finish(qtbot, window)
    assert result.exit_code == 0, log_text(window)
    assert "demo: finished 16 steps" in log_text(window)
    assert window.session.steps.steps == 16
    assert "Finished (exit code 0)" in window.run_label.text()
    assert "16 steps" in window.run_label.text()
    assert {"cpu/rss", "system/available"} <= set(window.plot.curve_keys())
    x, y = window.plot._curves["cpu/rss"].getData()
    assert len(x) >= 2 and float(np.max(y)) > 10  # drawn in MiB: a real process is > 10 MiB
    assert window.plot.samples_drawn == window.session.samples
    epochs = [m.label for m, _ in window.plot.marks.markers]
    assert epochs == ["epoch 1", "epoch 2"]
    label, now, peak = window.readings.row_text("cpu/rss")
    assert label == "process RSS" and now.endswith("MiB") and peak.endswith("MiB")


def test_traces_move_while_the_script_runs_and_stop_stops_it(qtbot, window, script_path):
    window.load_script(script_path("train_forever.py"), [], run=True)
    qtbot.waitUntil(
        lambda: window.session.steps.steps >= 3 and window.plot.samples_drawn >= 3,
        timeout=RUN_TIMEOUT_MS,
    )
    assert window.running and "Running" in window.run_label.text()
    drawn = window.plot.samples_drawn
    qtbot.waitUntil(lambda: window.plot.samples_drawn > drawn, timeout=10_000)
    window.act_stop.trigger()
    result = finish(qtbot, window)
    assert result.status is RunStatus.STOPPED
    assert window.banner.text().startswith("Stopped by the user at step")
    assert window.act_run.isEnabled() and not window.act_stop.isEnabled()
    assert "cpu/rss" in window.plot.curve_keys(), "traces stay after the run"


def test_a_script_that_never_steps_is_still_stopped(qtbot, window, script_path):
    window.load_script(script_path("never_steps.py"), [], run=True)
    qtbot.waitUntil(lambda: "spinning" in log_text(window), timeout=RUN_TIMEOUT_MS)
    window.stop()
    assert finish(qtbot, window).status is RunStatus.STOPPED


def test_a_failing_script_shows_its_traceback_and_keeps_the_traces(qtbot, window, script_path):
    window.load_script(script_path("raises_at_import.py"), [], run=True)
    result = finish(qtbot, window)
    assert result.exit_code == 1
    assert "Traceback" in log_text(window) and "RuntimeError: boom at import" in log_text(window)
    assert "raised RuntimeError: boom at import" in window.banner.text()
    assert "Failed (exit code 1)" in window.run_label.text()
    assert "cpu/rss" in window.plot.curve_keys()
    assert window.isVisible()


def test_sys_exit_code_shows_in_the_status_bar(qtbot, window, script_path):
    window.load_script(script_path("exit3.py"), [], run=True)
    finish(qtbot, window)
    assert "exit code 3" in window.run_label.text()
    assert "sys.exit(3)" in window.statusBar().currentMessage()


def test_out_of_memory_is_explained(qtbot, window, script_path):
    window.load_script(script_path("oom.py"), [], run=True)
    assert finish(qtbot, window).status is RunStatus.OOM
    assert "out of memory" in window.banner.text() and "batch size" in window.banner.text()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing.py", "No such script"),
        ("with_sibling", "is a folder, not a script"),
        ("notes.txt", "Is it a Python script at all?"),
        ("syntax_error.py", "Syntax error in syntax_error.py, line 2"),
    ],
)
def test_bad_scripts_are_refused_with_a_message(window, script_path, name, message):
    assert window.load_script(script_path(name), [], run=True) is False
    assert message in window.banner.text()
    assert not window.running
    assert message in window.statusBar().currentMessage() or message in log_text(window)


def test_signal_handlers_point_to_the_headless_mode(qtbot, window, script_path):
    window.load_script(script_path("uses_signal.py"), [], run=True)
    finish(qtbot, window)
    assert "main thread" in window.banner.text() and "torchmem run" in window.banner.text()


def test_dataloader_workers_run_to_the_end(qtbot, window, script_path):
    window.load_script(script_path("dataloader_workers.py"), [], run=True)
    assert finish(qtbot, window).exit_code == 0, log_text(window)
    assert "batches 4" in log_text(window)


def test_script_arguments_come_from_the_toolbar(qtbot, window, script_path):
    window.load_script(script_path("ok_print.py"), ["--lr", "0.1"])
    assert window.args_edit.text() == "--lr 0.1"
    window.args_edit.setText("--name 'two words'")
    window.run()
    finish(qtbot, window)
    assert "hello from the script ['--name', 'two words']" in log_text(window)
    window.args_edit.setText("'unclosed")
    assert window.run() is False
    assert "Cannot parse the script arguments" in window.banner.text()


def test_gc_collect_button_reports_what_it_freed(qtbot, window, script_path):
    window.load_script(script_path("train_steps.py"), ["3"], run=True)
    finish(qtbot, window)
    window.act_gc.trigger()
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("gc.collect:"))
    message = window.statusBar().currentMessage()
    assert "objects collected" in message and "RSS" in message
    qtbot.waitUntil(lambda: message in log_text(window))
    window.act_reset.trigger()
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("Reset peaks:"))
    assert "RSS peak" in window.statusBar().currentMessage()


def test_empty_cache_is_disabled_without_an_accelerator(window):
    assert not window.act_empty.isEnabled()
    assert "No accelerator" in window.act_empty.toolTip()
    assert not window.act_history.isEnabled() and not window.act_snapshot.isEnabled()


def test_allocation_history_toggles_from_the_result_and_the_snapshot_path_stays_up(
    qtbot, make_window, stub_cuda, tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCHMEM_SNAPSHOT_DIR", str(tmp_path))
    window = make_window([ProcessBackend(), TorchAllocatorBackend(stub_cuda, "cuda")])
    assert window.act_history.isEnabled() and not window.act_history.isChecked()
    window.act_history.trigger()
    assert not window.act_history.isChecked(), "checked only once the target says so"
    qtbot.waitUntil(window.act_history.isChecked)
    assert stub_cuda.memory.recording == 100_000
    assert "recording CUDA allocation history" in window.statusBar().currentMessage()
    window.act_snapshot.trigger()
    qtbot.waitUntil(lambda: window.banner.isVisible())
    written = list(tmp_path.glob("snapshot-*.pickle"))
    assert len(written) == 1 and str(written[0]) in window.banner.label.text()
    assert window.banner.severity == "info"
    window.act_history.trigger()
    qtbot.waitUntil(lambda: not window.act_history.isChecked())
    assert stub_cuda.memory.recording is None
    stub_cuda.initialized = False  # e.g. a new process that has not used CUDA yet
    window.act_history.trigger()
    qtbot.waitUntil(lambda: "has not used CUDA" in window.statusBar().currentMessage())
    assert not window.act_history.isChecked()


def test_accelerator_traces_and_empty_cache_with_a_stub_device(
    qtbot, make_window, stub_cuda, script_path
):
    window = make_window([ProcessBackend(), TorchAllocatorBackend(stub_cuda, "cuda")])
    assert window.act_empty.isEnabled()
    stub_cuda.alloc(0, 3 << 30)
    stub_cuda.free(0, 1 << 30)
    window.load_script(script_path("train_steps.py"), ["3"], run=True)
    finish(qtbot, window)
    assert window.plot.plots["accelerator"].isVisible()
    assert {"cuda:0/allocated", "cuda:0/reserved", "cuda:0/peak_allocated"} <= set(
        window.plot.curve_keys()
    )
    assert window.plot.plots["accelerator"].getAxis("left").labelText == "memory (GiB)"
    window.readings.refresh()
    assert window.readings.item(window.readings._rows["cuda:0/allocated"], 3).text() == "2.5 %"
    # The fragmentation gauge: split blocks in bytes, drawn; retries and OOMs counted, not.
    assert "cuda:0/inactive_split" in window.plot.curve_keys()
    assert "cuda:0/ooms" not in window.plot.curve_keys()
    now, peak = window.readings.row_text("cuda:0/ooms")[1:]
    assert now.split(" ")[0] == "0" and peak == "0", "a count, not bytes"
    window.act_empty.trigger()
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("empty_cache:"))
    assert "cuda:0 reserved -1.00 GiB (now 2.00 GiB)" in window.statusBar().currentMessage()


def test_the_window_finds_accelerators_when_a_run_starts(
    qtbot, stub_cuda, script_path, settings_path, monkeypatch
):
    """The window opens without torch (it is found as a run starts): until then there is
    nothing to empty; then the device's trace, capacity and empty_cache come."""
    from PySide6.QtCore import QSettings

    import torchmem.sources.inprocess as inprocess
    from torchmem.gui.windows.main_window import MainWindow
    from torchmem.session import Session

    calls = []

    def found():
        calls.append(1)
        return [TorchAllocatorBackend(stub_cuda, "cuda")]

    monkeypatch.setattr(inprocess, "accelerator_backends", found)
    source = inprocess.InProcessSource(Session(), lazy=True)
    window = MainWindow(source, QSettings(settings_path, QSettings.IniFormat))
    qtbot.addWidget(window)
    window.show()
    assert not calls and not window.act_empty.isEnabled()
    stub_cuda.alloc(0, 2 << 30)
    window.load_script(script_path("train_steps.py"), ["3"], run=True)
    finish(qtbot, window)
    assert calls == [1]
    assert window.act_empty.isEnabled()
    assert "cuda:0/allocated" in window.plot.curve_keys()
    assert window.session.capacity()["cuda:0"] == 80 << 30
    # The Readings' share of the device, from that capacity (2 GiB of 80).
    shares = [window.readings.item(r, 3).text() for r in range(window.readings.rowCount())]
    assert "2.5 %" in shares, shares
    window.load_script(script_path("train_steps.py"), ["2"], run=True)
    finish(qtbot, window)
    assert calls == [1], "found once"
    window.close()


@pytest.mark.slow
def test_the_window_opens_without_importing_torch(tmp_path):
    """torch takes longer to import than the whole window takes to appear: the window
    draws first (an attached or separate-process run never needs torch in it)."""
    code = (
        "import sys\n"
        "from PySide6.QtWidgets import QApplication\n"
        "from PySide6.QtCore import QSettings\n"
        "from torchmem.gui.windows.main_window import MainWindow\n"
        "app = QApplication([])\n"
        f"w = MainWindow(settings=QSettings({str(tmp_path / 's.ini')!r}, QSettings.IniFormat))\n"
        "w.show(); app.processEvents()\n"
        "print('torch' in sys.modules)\n"
        "w.close()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_x_axis_in_steps_units_and_hover(qtbot, window, script_path):
    window.load_script(script_path("train_steps.py"), ["12"], run=True)
    finish(qtbot, window)
    window.act_steps.trigger()
    assert window.plot.x_mode == "steps"
    assert window.plot.steps_plot.getAxis("bottom").labelText == "step"
    x, _ = window.plot._curves["cpu/rss"].getData()
    assert float(x.max()) == pytest.approx(12, abs=0.01)
    assert window.plot.plots["host"].getAxis("left").labelText == "memory (MiB)"
    window.unit_combo.setCurrentText("GiB")
    assert window.plot.plots["host"].getAxis("left").labelText == "memory (GiB)"
    # The readout's moment is that of the densest curve shown; with the RSS alone shown,
    # its reading nearest to the pointer, in steps. (With every curve shown, a clean-clone
    # CI run read the moment of another series, denser there than the RSS: 3.0 for 3.39.)
    for key, curve in window.plot._curves.items():
        curve.setVisible(key == "cpu/rss")
    text = window.plot.show_readout(6.0)
    at = float(text.split("<b>step ")[1].split("</b>")[0])
    nearest = x[np.argmin(np.abs(x - 6.0))]
    assert at == pytest.approx(nearest, abs=0.05) and "process RSS" in text and "MiB" in text


def test_panning_turns_follow_off_and_pause_freezes_the_picture(qtbot, window):
    window.source.sampler.sample()
    window.bridge.flush()
    vb = window.plot.plots["host"].vb
    vb.sigRangeChangedManually.emit([True, False])
    assert not window.act_follow.isChecked() and not window.plot.follow
    window.act_pause.trigger()
    drawn = window.plot.samples_drawn
    for _ in range(3):
        window.source.sampler.sample()
    window.bridge.flush()
    assert window.plot.samples_drawn == drawn
    window.act_pause.trigger()
    assert window.plot.samples_drawn == window.session.samples


def test_redraws_are_throttled(qtbot, window):
    session = window.session
    start_redraws, started = window.bridge.redraws, time.monotonic()
    for i in range(3000):
        session.submit(Sample(session.now(), {"cpu/rss": float(i)}))
    qtbot.waitUntil(lambda: window.plot.samples_drawn == session.samples)
    elapsed = time.monotonic() - started
    redraws = window.bridge.redraws - start_redraws
    assert 1 <= redraws <= REDRAW_HZ * elapsed + 2, f"{redraws} redraws in {elapsed:.2f} s"


def test_rerun_while_running_restarts(qtbot, window, script_path):
    window.load_script(script_path("train_forever.py"), [], run=True)
    qtbot.waitUntil(lambda: window.session.steps.steps >= 2, timeout=RUN_TIMEOUT_MS)
    window.act_rerun.trigger()

    def second_run_started():
        log = window.log.toPlainText()
        return log.count("[torchmem] running ") == 2 and window.running

    qtbot.waitUntil(second_run_started, timeout=RUN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: window.session.steps.steps >= 1, timeout=RUN_TIMEOUT_MS)
    log = window.log.toPlainText()
    # The first run's end, a rule, then the second run: the user sees where each begins.
    assert log.index("Stopped") < log.index("─" * 60) < log.rindex("[torchmem] running ")
    window.stop()
    finish(qtbot, window)


def test_closing_while_a_script_runs_is_quick_and_clean(qtbot, make_window, script_path):
    window = make_window()
    window.load_script(script_path("train_forever.py"), [], run=True)
    qtbot.waitUntil(lambda: window.session.steps.steps >= 2, timeout=RUN_TIMEOUT_MS)
    started = time.monotonic()
    window.close()
    assert time.monotonic() - started < 5
    assert not window.force_exit_needed
    assert not window.source.sampler.running


def test_view_settings_are_remembered(qtbot, make_window):
    first = make_window()
    first.act_steps.trigger()
    first.unit_combo.setCurrentText("GiB")
    first.rate_spin.setValue(25)
    first.resize(760, 590)  # fits the offscreen 800x600 screen
    remembered = (first.width(), first.height())
    first.close()
    second = make_window()
    assert second.plot.x_mode == "steps" and second.act_steps.isChecked()
    assert second.unit_combo.currentText() == "GiB"
    assert second.source.sampler.hz == 25
    assert (second.width(), second.height()) == remembered


def test_dark_theme_darkens_the_plots_and_keeps_every_text_readable(window):
    from PySide6.QtGui import QColor

    window.session.submit(Sample(0.5, {"cpu/rss": 1e8, "system/available": 1e9}))
    window.plot.refresh(force=True)  # the legend has entries before the switch

    def text_lightness():
        legend = [QColor(label.opts["color"]).lightness() for _, label in window.plot.legend.items]
        html = [label.item.toHtml() for _, label in window.plot.legend.items]
        return legend, html, window.plot.steps_label.color.lightness()

    tune = window.panels.tune.plot  # a panel made before the switch follows it too
    try:
        window.set_theme("dark")
        assert window.plot.backgroundBrush().color().lightness() < 60
        assert tune.backgroundBrush().color().lightness() < 60
        legend, html, steps = text_lightness()
        assert legend and all(v > 180 for v in legend) and steps > 180
        assert all("#e1e1e4" in h.lower() for h in html), "labels re-rendered in the new colour"
        window.set_theme("light")
        assert window.plot.backgroundBrush().color().lightness() > 200
        assert tune.backgroundBrush().color().lightness() > 200, "not pyqtgraph's black"
        legend, html, steps = text_lightness()
        assert all(v < 80 for v in legend) and steps < 80
    finally:
        apply_theme(QApplication.instance(), "system")


def test_dense_markers_label_only_where_their_labels_have_room(qtbot, window):
    """A script that marks every few steps: labels drawn over each other were a smear.
    The newest labels win, no two shown ones overlap as drawn, and zooming in brings them
    back."""
    from PySide6.QtWidgets import QApplication

    from torchmem.events import Marker, MarkerKind

    window.resize(900, 700)
    window.show()
    qtbot.waitExposed(window)
    session = window.session
    for i in range(60):
        session.submit(Sample(i * 0.1, {"cpu/rss": 1e8 + i}))
        session.submit(Marker(i * 0.1, MarkerKind.USER, f"every ten {i * 10}", i * 10))
    plot = window.plot

    def labels_in_view():
        QApplication.processEvents()  # pyqtgraph places labels as the view changes
        out = []
        for _, lines in plot.marks.markers:
            line = next(ln for ln in lines if getattr(ln, "label", None))
            (x0, x1), _ = line.getViewBox().viewRange()
            if x0 <= line.value() <= x1:
                out.append((line.label.isVisible(), line.label.sceneBoundingRect()))
        return out

    def overlapping(labels):
        shown = [rect for visible, rect in labels if visible]
        return [(a, b) for i, a in enumerate(shown) for b in shown[i + 1 :] if a.intersects(b)]

    plot.refresh(force=True)
    whole = labels_in_view()
    assert len(whole) == 60 and 1 < sum(v for v, _ in whole) < 20
    assert whole[-1][0], "the newest marker keeps its label"
    assert not overlapping(whole)
    plot.set_follow(False)
    plot.plots["host"].setXRange(5.55, 5.92, padding=0)  # zoomed in: room for each label
    zoomed = labels_in_view()
    shown_before = sum(v for v, rect in whole[-4:])  # the same four markers, zoomed out
    assert sum(v for v, _ in zoomed) >= 3 > shown_before and not overlapping(zoomed)


def test_a_marker_label_is_drawn_over_the_traces(qtbot, window):
    # A trace that came after the marker was drawn over its label ("epoch 2" read "epoch").
    from torchmem.events import Marker, MarkerKind

    session = window.session
    session.submit(Sample(0.0, {"cpu/rss": 1e8}))
    session.submit(Marker(0.5, MarkerKind.EPOCH, "epoch 2", 10))
    session.submit(Sample(1.0, {"cpu/rss": 2e8, "cpu/uss": 1.5e8}))  # a trace after it
    plot = window.plot
    plot.refresh(force=True)
    _, lines = plot.marks.markers[-1]
    labelled = next(ln for ln in lines if getattr(ln, "label", None))
    curves = plot.plots["host"].listDataItems()
    assert curves and all(labelled.zValue() > c.zValue() for c in curves)


def test_only_the_newest_marker_lines_are_kept(qtbot, window):
    from torchmem.events import Marker, MarkerKind
    from torchmem.gui.plots.plot_markers import MAX_MARKER_LINES

    session = window.session
    for i in range(3 * MAX_MARKER_LINES):
        session.submit(Sample(i * 0.1, {"cpu/rss": 1e8}))
        session.submit(Marker(i * 0.1, MarkerKind.USER, f"mark {i}", i))
        if i % 50 == 0:
            window.plot.refresh(force=True)
    window.plot.refresh(force=True)
    labels = [m.label for m, _ in window.plot.marks.markers]
    assert len(labels) == MAX_MARKER_LINES, "thousands of lines would slow every frame"
    assert labels[-1] == f"mark {3 * MAX_MARKER_LINES - 1}" and labels == sorted(
        labels, key=lambda text: int(text.split()[1])
    )
    # The dropped lines are gone, not only hidden: a week of epoch markers stays bounded.
    import gc

    import pyqtgraph as pg
    from PySide6.QtCore import QEvent

    QApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    gc.collect()
    kept = sum(len(lines) for _, lines in window.plot.marks.markers)
    alive = sum(type(o) is pg.InfiniteLine for o in gc.get_objects())  # no proxy asked
    assert alive - kept < 10, f"{alive - kept} lines left alive"  # 3: the hover lines


def test_the_cached_axes_still_redraw_when_the_traces_move(qtbot, window, monkeypatch):
    """The axes are cached as pixmaps (a frame costs a third): the cache must be dropped
    whenever the range moves, or the tick labels would stay those of the first frame."""
    from PySide6.QtCore import QRect

    session, plot = window.session, window.plot
    for i in range(50):
        session.submit(Sample(i * 0.1, {"cpu/rss": 100e6 + i * 1e6}))
    plot.refresh(force=True)
    axis = plot.plots["host"].getAxis("left")

    def axis_pixels() -> tuple[QImage, list]:
        QApplication.processEvents()
        rect = plot.mapFromScene(axis.sceneBoundingRect()).boundingRect()
        image = plot.grab(QRect(rect.x(), rect.y(), 70, rect.height())).toImage()
        return image, [t for _, t in axis.tickValues(*axis.range, axis.height())]

    before, ticks_before = axis_pixels()
    for i in range(50, 100):  # the run grows tenfold: the y range must follow
        session.submit(Sample(i * 0.1, {"cpu/rss": 1e9 + i * 1e7}))
    plot.refresh(force=True)
    after, ticks_after = axis_pixels()
    assert axis.cacheMode() == QGraphicsItem.CacheMode.DeviceCoordinateCache
    assert ticks_after != ticks_before
    assert after != before, "the axis shows the old tick labels"
    # And a frame where nothing moved does not paint the axes again.
    import pyqtgraph as pg

    painted = []
    paint = pg.AxisItem.paint
    monkeypatch.setattr(pg.AxisItem, "paint", lambda *a: painted.append(1) or paint(*a))
    plot.grab()
    assert not painted


def test_the_legend_wraps_to_the_width_and_never_widens_the_plots(qtbot):
    """Eight series in a narrow window: the legend takes more rows, not more width (a
    legend wider than the view pushed the plots' right edge out of the window)."""
    from torchmem.gui.plots.trace_plot import TracePlot
    from torchmem.session import Session

    session = Session()
    plot = TracePlot(session)
    qtbot.addWidget(plot)
    plot.resize(460, 500)
    plot.show()
    keys = ("cuda:0/allocated", "cuda:0/reserved", "cuda:0/peak_allocated", "cuda:0/nvml_used",
            "cpu/rss", "cpu/uss", "cpu/heap_free", "system/available")  # fmt: skip
    for i in range(20):
        session.submit(Sample(i * 0.1, dict.fromkeys(keys, 1e9 + i * 1e6)))
    plot.refresh(force=True)
    QApplication.processEvents()
    legend = plot.legend.sceneBoundingRect()
    assert legend.width() <= plot.width() and len(plot.legend.items) == len(keys)
    assert plot.plots["host"].sceneBoundingRect().right() <= plot.width()
    rows = -(-len(keys) // plot.legend.columnCount)
    assert rows >= 2 and legend.height() >= rows * 18, "a row of the legend is cut off"
    plot.resize(1400, 500)
    QApplication.processEvents()
    assert plot.legend.columnCount == 4


def job_plot(qtbot, ranks: int):
    """A trace plot of a job of ``ranks`` ranks, each with five host metrics, and their
    total, at a default window's width."""
    from torchmem.gui.plots.trace_plot import TracePlot
    from torchmem.session import Session

    session = Session()
    plot = TracePlot(session)
    qtbot.addWidget(plot)
    plot.resize(1100, 560)
    plot.show()
    metrics = ("cpu/rss", "cpu/uss", "cpu/heap_free", "cpu/rss_peak", "system/available")
    for i in range(20):
        values = {f"rank{r}/{m}": (r + 1) * 4e8 + i * 1e6 for r in range(ranks) for m in metrics}
        values["total/cpu/rss"] = sum(values[f"rank{r}/cpu/rss"] for r in range(ranks))
        session.submit(Sample(i * 0.1, values))
    plot.refresh(force=True)
    QApplication.processEvents()
    return plot


def click_legend_entry(qtbot, plot, label: str) -> None:
    """Click the sample beside ``label`` in the plot's legend, as a user would."""
    from PySide6.QtCore import Qt

    sample = next(s for s, text in plot.legend.items if text.text == label)
    at = plot.mapFromScene(sample.sceneBoundingRect().center())
    qtbot.mouseClick(plot.viewport(), Qt.MouseButton.LeftButton, pos=at)


# QTest asks the view to accept the click; pyqtgraph's scene takes it without saying so.
@pytest.mark.qt_log_ignore("Mouse event .* not accepted by receiving widget")
def test_a_jobs_legend_lists_each_process_and_metric_once_and_each_switches_its_traces(qtbot):
    """Entry per trace, 3 ranks made 16 entries and left the Host plot ~100 px; by process
    and by metric they are 9, and the plot keeps most of the window."""
    plot = job_plot(qtbot, 3)
    labels = [text.text for _, text in plot.legend.items]
    assert labels[:4] == ["rank 0", "rank 1", "rank 2", "total"]
    metrics = ["process RSS", "process USS", "C heap free", "process peak RSS (kernel)",
               "system available"]  # fmt: skip
    assert sorted(labels[4:]) == sorted(metrics)
    assert plot.plots["host"].sceneBoundingRect().height() > 300
    shown = {"rank0/cpu/rss", "rank1/cpu/rss", "rank2/cpu/rss", "total/cpu/rss",
             "rank0/cpu/uss", "rank1/cpu/uss", "rank2/cpu/uss"}  # fmt: skip
    assert set(plot.visible_keys()) == shown  # the series hidden until asked for stay so

    click_legend_entry(qtbot, plot, "process USS")  # a metric, in every process
    assert set(plot.visible_keys()) == shown - {"rank0/cpu/uss", "rank1/cpu/uss", "rank2/cpu/uss"}
    click_legend_entry(qtbot, plot, "rank 1")  # a process, every metric of it
    assert set(plot.visible_keys()) == {"rank0/cpu/rss", "rank2/cpu/rss", "total/cpu/rss"}
    click_legend_entry(qtbot, plot, "C heap free")  # shown where its process is on
    assert {"rank0/cpu/heap_free", "rank2/cpu/heap_free"} <= set(plot.visible_keys())
    assert "rank1/cpu/heap_free" not in plot.visible_keys()

    # Choosing one rank in the window keeps what the legend switched off.
    plot.set_scope("rank0")
    assert set(plot.visible_keys()) == {"rank0/cpu/rss", "rank0/cpu/heap_free"}
    plot.set_scope(None)
    click_legend_entry(qtbot, plot, "rank 1")
    assert "rank1/cpu/rss" in plot.visible_keys() and "rank1/cpu/uss" not in plot.visible_keys()

    # A new run starts with a legend of its own.
    plot.clear_data()
    assert not plot.legend.items and not plot.job_legend.processes


def test_a_jobs_legend_grows_by_one_entry_a_rank(qtbot):
    sizes = [len(job_plot(qtbot, ranks).legend.items) for ranks in (2, 8)]
    assert sizes == [2 + 1 + 5, 8 + 1 + 5]  # against 2*5+1 = 11 and 8*5+1 = 41 traces


def test_a_stale_reading_is_never_shown_as_now(qtbot, window):
    """USS is read every 2 s: after a burst its old reading must not pass for "now"."""
    from torchmem.events import RunFinished, RunStarted, RunStatus

    s = window.session
    s.submit(RunStarted(0.0, "burst.py", ()))
    s.submit(Sample(1.0, {"cpu/rss": 3.3 * 2**30, "cpu/uss": 3.2 * 2**30}))
    for i in range(2, 20):
        s.submit(Sample(float(i), {"cpu/rss": 356 * 2**20}))
    s.submit(RunFinished(19.5, RunStatus.FINISHED, 0, "finished"))
    window.readings.refresh()
    _, rss_now, _ = window.readings.row_text("cpu/rss")
    _, uss_now, _ = window.readings.row_text("cpu/uss")
    assert rss_now == "356.0 MiB"
    assert uss_now.endswith("· 18 s"), uss_now  # its age, greyed
    assert window.readings.horizontalHeaderItem(1).text() == "Last"  # the run has ended
    # Drawn as dots, one per reading, never as a line ramping between readings.
    window.plot.refresh(force=True)
    uss_curve = window.plot._curves["cpu/uss"]
    assert uss_curve.opts["pen"] is None and uss_curve.opts["symbol"] == "o"
    # A USS read a moment before the newest RSS still says so: never two moments side by side.
    s.submit(Sample(20.0, {"cpu/rss": 356 * 2**20, "cpu/uss": 340 * 2**20}))
    s.submit(Sample(20.3, {"cpu/rss": 300 * 2**20}))
    window.readings.refresh()
    assert window.readings.row_text("cpu/uss")[1] == "340.0 MiB · 0.3 s"
    assert window.readings.row_text("cpu/rss")[1] == "300.0 MiB"


def test_uss_is_read_with_the_rss_of_the_same_moment():
    out: dict[str, float] = {}
    ProcessBackend(uss_every_s=0.0).read(out)
    assert 0 < out["cpu/uss"] <= out["cpu/rss"]


def test_a_script_blocked_in_a_c_call_is_said_and_can_be_abandoned(qtbot, window, script_path):
    window.runs.stuck_after_ms = 300
    window.load_script(script_path("blocked_in_c.py"), ["4"], run=True)
    qtbot.waitUntil(lambda: "blocked now" in log_text(window), timeout=RUN_TIMEOUT_MS)
    window.act_stop.trigger()
    assert not window.act_stop.isEnabled() and "Stopping" in window.run_label.text()
    qtbot.waitUntil(lambda: "does not stop" in window.banner.text(), timeout=10_000)
    assert "blocked in a C call" in window.banner.text()
    assert window.act_abandon.isEnabled()
    assert window.banner.action_button.text() == "Abandon the run"
    window.banner.action_button.click()
    assert not window.running and window.act_run.isEnabled()
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=5_000)
    assert window.last_result.message.startswith("abandoned at step 0")
    assert "Stopped" in window.run_label.text()
    # The abandoned thread ends when sleep returns; nothing it says reaches this Session.
    qtbot.waitUntil(lambda: not window.runs.abandoned_alive, timeout=60_000)
    assert "woke up" not in log_text(window)
    assert window.session.run_finished.message.startswith("abandoned")
    assert not window.source.abandoned and not window.source.running
    # Its recording reads back as it ended: stopped, abandoned, not a crash at 0.0 s.
    from torchmem.record.replay import load
    from torchmem.report.recorded import recorded_summary

    window.recordings.recorder.wait_closed()
    data = recorded_summary(load(window.recordings.recorder.last_path))
    assert data["status"] == "stopped" and data["message"].startswith("abandoned at step 0")
    assert data["duration_s"] > 0.2


def test_opening_a_script_while_one_runs_asks_and_keeps_the_title_true(
    qtbot, window, script_path, monkeypatch
):
    from PySide6.QtWidgets import QMessageBox

    window.load_script(script_path("train_forever.py"), [], run=True)
    qtbot.waitUntil(lambda: window.session.steps.steps >= 3, timeout=RUN_TIMEOUT_MS)
    assert window.windowTitle().startswith("train_forever.py")
    answers = [QMessageBox.No, QMessageBox.Yes]
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: answers.pop(0))
    assert not window.load_script(script_path("ok_print.py"), [], run=True)
    assert window.windowTitle().startswith("train_forever.py") and window.running
    assert "Kept train_forever.py running" in window.statusBar().currentMessage()
    assert window.load_script(script_path("ok_print.py"), ["quoted arg"], run=True)
    # The running script stops first; the new one runs after it, and only then is named.
    qtbot.waitUntil(
        lambda: (
            window.session.run_started is not None
            and window.session.run_started.script.endswith("ok_print.py")
        ),
        timeout=RUN_TIMEOUT_MS,
    )
    assert window.windowTitle().startswith("ok_print.py")
    result = finish(qtbot, window)
    assert result.exit_code == 0, log_text(window)
    text = log_text(window)
    # "running …" precedes the script's own first line, with its arguments quoted.
    assert text.rindex("running ") < text.index("hello from the script")
    assert "ok_print.py 'quoted arg'" in text


def test_a_run_that_fails_at_once_has_plain_axis_units(qtbot, window, script_path):
    window.load_script(script_path("exit3.py"), [], run=True)
    finish(qtbot, window)
    window.plot.refresh(force=True)
    for plot in window.plot.plots.values():
        assert "(x" not in plot.getAxis("left").labelString()
    assert "(x" not in window.plot.steps_plot.getAxis("bottom").labelString()


def test_a_remembered_separate_process_mode_is_shown(make_window, settings_path):
    from PySide6.QtCore import QSettings

    QSettings(settings_path, QSettings.IniFormat).setValue("run/isolated", True)
    window = make_window()
    assert window.act_isolated.isChecked()
    assert window.mode_label.isVisible() and "Separate process" in window.mode_label.text()
    window.act_isolated.trigger()
    assert not window.mode_label.isVisible()


def test_an_oom_opens_a_report_that_names_the_tensors_in_the_failing_frames(
    qtbot, window, script_path
):
    script = script_path("oom_in_forward.py")
    window.load_script(str(script), [], run=True)
    assert finish(qtbot, window).status is RunStatus.OOM
    qtbot.waitUntil(
        lambda: window.report.oom_dialog is not None and window.report.oom_dialog.isVisible()
    )
    dialog = window.report.oom_dialog
    report = dialog.report
    assert report.device == "cpu" and report.requested_bytes == 1 << 50
    names = [dialog.table.item(r, 1).text() for r in range(dialog.table.rowCount())]
    assert names[0] == "hidden", "the local of the frame that failed, named, largest first"
    assert dialog.table.item(0, 0).text() == "8.00 MiB"
    assert window.act_oom.isEnabled()
    dialog.buttons["tune"].click()
    assert window.tune_dock.isVisible()


def test_a_process_without_a_rank_never_takes_a_ranks_colour():
    """An mp.spawn script's own process (``pid 4242``) beside its ranks: pid 4242 and
    rank 2 once had the same orange (4242 % 8 == 2)."""
    from torchmem.gui.plots.trace_plot import series_color
    from torchmem.series import SeriesName

    def rss(scope):
        return series_color(SeriesName(scope, "cpu", "rss"))

    ranks = {rss(f"rank{r}").name() for r in range(8)}
    for scope in ("pid4242", "pid4243", "pid7@node1"):
        assert rss(scope).name() not in ranks
    assert rss("pid4242") != rss("pid4243")


def test_open_recent_lists_one_script_as_one_entry_after_a_restart(
    make_window, script_path, settings_path
):
    # What an INI file holds after one script was opened; read back, it is a string, not
    # a list of one, and read as it came the menu listed its characters ("/", "/", ".").
    script = script_path("ok_print.py")
    Path(settings_path).write_text(f"[General]\nrecent={script}\n")
    window = make_window()
    assert [a.text() for a in window.recent_menu.actions()] == [script]
    assert window.load_script(script_path("exit3.py"), [], run=False)
    assert [a.text() for a in window.recent_menu.actions()] == [
        script_path("exit3.py"),
        script,
    ]


def test_the_shortcuts_dialog_keeps_keys_apart_from_what_they_do(window):
    from PySide6.QtGui import QFont, QFontMetrics, QTextDocument

    from torchmem.gui.windows.window_chrome import shortcuts_table

    doc = QTextDocument()
    doc.setHtml(shortcuts_table(window))
    doc.setTextWidth(2000)
    layout = doc.documentLayout()
    cells, block = [], doc.begin()
    while block.isValid():
        if block.text():
            cells.append((block.text(), layout.blockBoundingRect(block).x()))
        block = block.next()
    keys, texts = cells[0::2], cells[1::2]
    assert ("Ctrl+Shift+O", keys[0][1]) in keys and "Recorded sessions…" in dict(texts)
    bold = QFont(doc.defaultFont())
    bold.setBold(True)
    widest = max(QFontMetrics(bold).horizontalAdvance(k) for k, _ in keys)
    gap = min(x for _, x in texts) - keys[0][1] - widest
    assert gap >= 12, f"the description starts {gap:.0f} px after the widest key"


def test_the_hover_readout_pairs_readings_of_one_moment_and_forgets_old_data(window):
    from torchmem.events import Sample

    MiB = 1 << 20
    for i in range(50):  # RSS at 10 Hz, USS every 2 s (as the sampler reads them)
        values = {"cpu/rss": float((500 + i) * MiB)}
        if i % 20 == 0:
            values["cpu/uss"] = float((400 + i) * MiB)
        window.session.submit(Sample(i / 10, values))
    window.bridge.flush()
    window.plot.refresh(force=True)
    text = window.plot.show_readout(3.02)
    assert "t = 3.0 s" in text and "process RSS</span> 530.0 MiB" in text
    assert "process USS</span> 420.0 MiB <i>(read 1.0 s before)</i>" in text
    text = window.plot.show_readout(4.0)
    assert "USS</span> 440.0 MiB" in text and "read" not in text, "the same moment: no age"
    window.act_steps.trigger()  # another x unit: the old "t = ..." must go
    assert window.plot.readout.text == ""
    window.plot.show_readout(1.0)
    window.clear_views()  # a new run or an attach
    assert window.plot.readout.text == ""
    assert not any(line.isVisible() for line in window.plot._crosshairs)
