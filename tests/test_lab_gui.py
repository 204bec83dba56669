"""The Lab panel, driven as a user would: choose, Run, watch the rows come, export."""

from __future__ import annotations

import csv

import psutil
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QScrollArea

from torchmem.gui.panels.lab_panel import LabPanel

RUN_TIMEOUT_MS = 120_000


@pytest.fixture
def panel(qtbot):
    panel = LabPanel()
    qtbot.addWidget(panel)
    panel.resize(1300, 650)
    yield panel
    assert panel.shutdown()


@pytest.mark.slow
def test_a_run_fills_table_and_plots_row_by_row_and_exports(qtbot, panel, tmp_path):
    panel.set_ops(["add", "add_", "view", "matmul"])
    panel.expr_edit.setText("torch.sigmoid(a) * b")
    panel.sizes_edit.setText("64, 128")
    panel.repeats_spin.setValue(2)
    seen: list[int] = []
    panel.table.model().rowsInserted.connect(lambda *_: seen.append(panel.table.rowCount()))
    assert panel.start()
    assert not panel.run_button.isEnabled() and panel.cancel_button.isEnabled()
    assert not panel.sizes_edit.isEnabled()  # the form is frozen while it runs
    qtbot.waitUntil(lambda: not panel.running, timeout=RUN_TIMEOUT_MS)
    assert seen == list(range(1, 11))  # row by row, not at the end
    by_op = {(r.op, r.size): r for r in panel.rows}
    assert by_op[("add", 128)].result_bytes == 4 * 128 * 128
    assert by_op[("add_", 128)].shares_input_storage and by_op[("add_", 128)].result_bytes == 0
    # What the table says, in the units a user reads.
    texts = [panel.table.item(r, 4).text() for r in range(panel.table.rowCount())]
    assert "64.00 KiB" in texts and "0 B" in texts
    assert panel.table.item(2, 11).text().startswith("in place")
    # Drawn: a memory curve for each op that allocates; add_ and view are said instead.
    memory = {item.name(): item for item in panel.memory_plot.listDataItems()}
    assert set(memory) == {"add", "add_", "view", "matmul", "torch.sigmoid(a) * b"}
    assert list(memory["matmul"].xData) == [64, 128]  # drawn on log axes
    assert memory["view"].xData is None or len(memory["view"].xData) == 0
    assert "add_, view: no extra memory" in panel.status.text()
    assert panel.progress.value() == 10
    csv_path, png_path = tmp_path / "lab.csv", tmp_path / "lab.png"
    assert panel.export(str(csv_path)) and panel.export(str(png_path))
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 10 and rows[0]["op"] == "add" and rows[0]["result_bytes"] == "16384"
    assert png_path.stat().st_size > 5000


def test_two_dtypes_are_measured_side_by_side(qtbot, panel):
    panel.set_ops(["add"])
    panel.sizes_edit.setText("64")
    panel.dtype2_combo.setCurrentText("float16")
    panel.isolated_check.setChecked(False)  # in the window: quicker, and said so
    assert panel.start()
    assert "in the window" in panel.status.text()
    qtbot.waitUntil(lambda: not panel.running, timeout=RUN_TIMEOUT_MS)
    assert [r.result_bytes for r in panel.rows] == [4 * 64 * 64, 2 * 64 * 64]
    names = {item.name() for item in panel.memory_plot.listDataItems()}
    assert names == {"add (float32, cpu)", "add (float16, cpu)"}


@pytest.mark.parametrize(
    ("sizes", "expression", "message"),
    [
        ("big", "", "sizes must be whole numbers"),
        ("64", "a +", "not a Python expression"),
        ("64", "a + zz", "unknown name zz"),
    ],
)
def test_bad_input_is_said_in_red_and_starts_nothing(qtbot, panel, sizes, expression, message):
    panel.sizes_edit.setText(sizes)
    panel.expr_edit.setText(expression)
    if expression:
        assert "c0392b" in panel.expr_edit.styleSheet()  # marked while typing
    assert not panel.start()
    assert message in panel.status.text() and "c0392b" in panel.status.styleSheet()
    assert not panel.running and panel.run_button.isEnabled()


@pytest.mark.slow
def test_cancel_ends_the_measurement_in_flight_and_leaves_the_panel_usable(qtbot, panel):
    me = psutil.Process()

    def children() -> set[int]:
        return {p.pid for p in me.children(recursive=True)}

    before = children()  # Xvfb, for one
    panel.set_ops(["matmul"])
    panel.sizes_edit.setText("64, 2048, 2048, 2048")
    panel.repeats_spin.setValue(1000)
    assert panel.start()
    qtbot.waitUntil(lambda: len(panel.rows) == 1, timeout=RUN_TIMEOUT_MS)
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: not panel.running, timeout=10_000)
    assert len(panel.rows) < 4 and "cancelled" in panel.status.text()
    qtbot.waitUntil(lambda: children() <= before, timeout=5_000)
    assert panel.run_button.isEnabled() and panel.sizes_edit.isEnabled()


@pytest.mark.slow
def test_the_window_opens_the_lab_from_the_memory_menu(qtbot, make_window):
    window = make_window()
    window.act_lab.trigger()  # Memory > Memory lab… (Ctrl+L)
    assert window.act_lab.shortcut().toString() == "Ctrl+L"
    assert window.lab_dock.widget() is window.panels.lab and window.lab_dock.isVisible()
    window.panels.lab.set_ops(["add"])
    window.panels.lab.sizes_edit.setText("64")
    assert window.panels.lab.start()
    assert window.shutdown()  # closing waits for the lab's thread
    assert not window.panels.lab.running


def test_the_lab_and_tune_tabs_fit_a_short_window_and_their_buttons_can_be_reached(
    qtbot, make_window
):
    # The Lab's form at its full height made the tabbed dock area taller than a short
    # window could give it, and Qt clipped the Tune tab: its Start button lay below the
    # window's edge, out of reach.
    window = make_window()
    window.resize(1100, 640)
    window.act_lab.trigger()
    window.act_tune.trigger()
    panels = window.panels
    for dock, panel, action in (
        (window.lab_dock, panels.lab, panels.lab.run_button),
        (window.tune_dock, panels.tune, panels.tune.start_button),
    ):
        dock.raise_()
        qtbot.waitUntil(lambda p=panel: p.isVisible())
        QApplication.processEvents()
        columns = [a for a in panel.findChildren(QScrollArea) if a.isAncestorOf(action)]
        for column in columns:  # scrolled to, as a user would
            column.ensureWidgetVisible(action)
        QApplication.processEvents()
        # The button is drawn inside its dock, and the dock inside the window.
        corner = action.mapTo(window, action.rect().bottomRight())
        assert dock.geometry().contains(corner), (panel, dock.geometry(), corner)
        assert dock.geometry().bottom() <= window.statusBar().geometry().top()
        # Every field of the form is as wide as it asks to be: nothing cut at the right.
        for column in columns:
            assert column.viewport().width() >= column.widget().minimumSizeHint().width()
    # The Tune plot keeps the height of its axis title (squashed, it read "eak memor").
    window.tune_dock.raise_()
    QApplication.processEvents()
    plot = panels.tune.plot.getPlotItem()
    assert plot.vb.height() >= plot.getAxis("left").label.boundingRect().width()


def test_the_tune_tab_opens_with_room_to_work_in(qtbot, make_window):
    # Opened under the traces it kept the Log's height: a tuning's plot and its table of
    # trials got two rows each in a 1400x900 window.
    window = make_window()
    window.resize(1400, 900)
    window.show()
    qtbot.waitExposed(window)
    window.act_tune.trigger()
    qtbot.waitUntil(lambda: window.tune_dock.height() >= window.height() * 2 // 5)
    opened = window.tune_dock.height()
    window.resizeDocks([window.tune_dock], [window.height() * 2 // 3], Qt.Vertical)
    qtbot.waitUntil(lambda: window.tune_dock.height() > opened)
    taller = window.tune_dock.height()
    window.act_lab.trigger()
    window.act_tune.trigger()  # opened again: the height the user gave it is kept
    QApplication.processEvents()
    assert window.tune_dock.height() == taller


def test_the_empty_plots_frame_the_sizes_and_several_decades(qtbot, panel):
    # Before a run, a log axis spanning one decade labelled its 2..9 on top of each other.
    panel.show()
    qtbot.waitExposed(panel)
    for plot in (panel.memory_plot, panel.time_plot):
        (x_low, x_high), (y_low, y_high) = plot.viewRange()
        assert y_high - y_low >= 3  # decades: 10^-1 .. 10^3 MiB, 10 us .. 1 s
        ticks = plot.getAxis("bottom")._tickLevels[0]
        assert [label for _, label in ticks] == ["256", "1,024", "2,048"]
        assert x_low < 2.41 < 3.31 < x_high  # log10 of 256 and 2048 in view
