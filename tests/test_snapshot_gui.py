"""The Snapshot window, as a user opens it: from the File menu's opener or a drop, read
with a progress dialog, then the peak, the live set and the stacks."""

from __future__ import annotations

import numpy as np
import psutil
import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QPalette
from PySide6.QtWidgets import QPushButton
from snapshot_files import MiB, random_snapshot, small_snapshot, write

# Starts torchmem, agent or training processes (conftest checks the mark).
pytestmark = pytest.mark.slow

OPEN_TIMEOUT_MS = 60_000


def open_snapshot(qtbot, window, path):
    """The Snapshot window ``window`` opens on ``path``, once it is read."""
    with qtbot.waitSignal(window.snapshots.opened, timeout=OPEN_TIMEOUT_MS) as signal:
        assert window.snapshots.open(str(path))
    snap = signal.args[0]
    qtbot.addWidget(snap)
    return snap


@pytest.fixture
def opened(qtbot, make_window, tmp_path):
    """The main window, and a Snapshot window on the hand-made snapshot."""
    window = make_window()
    return window, open_snapshot(qtbot, window, write(tmp_path / "small.pickle", small_snapshot()))


def test_it_opens_at_the_peak_with_the_live_set_by_line(opened):
    _, snap = opened
    assert "peak active 13.50 MiB" in snap.facts.text()
    table = snap.table
    rows = [(table.item(r, 0).text(), table.item(r, 1).text(), table.item(r, 3).text())
            for r in range(table.rowCount())]  # fmt: skip
    assert rows[0] == ("main (train.py:50)", "8.00 MiB", "gradient")
    assert ("main (train.py:40)", "3.00 MiB", "optimizer state") in rows
    assert "backward (/x/torch/_tensor.py:600)" in snap.stack_view.toPlainText()
    assert "13.50 MiB active in 4 allocations" in snap.moment_label.text()
    legend = {item.name() for item in snap.plot.plotItem.listDataItems() if item.name()}
    assert legend == {"parameter", "optimizer state", "gradient", "activation", "other"}
    # Written in the palette's text colour, as the axes are (pyqtgraph's light grey was
    # hard to read on a light background).
    text = snap.palette().color(QPalette.Text).name()
    labels = snap.plot.plotItem.legend.items
    assert labels and all(f"color:{text};" in label.item.toHtml() for _, label in labels)


def test_a_moment_and_a_range_narrow_what_is_shown(opened):
    _, snap = opened
    before_c_freed = int(snap.line.events[2])  # after D's alloc: B, C, D and the old ones
    snap.set_moment(before_c_freed)
    kinds = {snap.table.item(r, 3).text() for r in range(snap.table.rowCount())}
    assert "activation" in kinds and "gradient" not in kinds
    assert "10.50 MiB active" in snap.moment_label.text()
    snap.region.setRegion((0, 1.5e-6))  # the first two microseconds after the first event
    snap._on_region()
    assert "7.50 MiB active" in snap.moment_label.text()


def test_a_file_that_is_not_a_snapshot_is_said_in_the_banner(qtbot, make_window, tmp_path):
    window = make_window()
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle")
    with qtbot.waitSignal(window.snapshots.failed, timeout=OPEN_TIMEOUT_MS):
        window.snapshots.open(str(bad))
    qtbot.waitUntil(lambda: not window.snapshots.busy, timeout=OPEN_TIMEOUT_MS)
    assert "not a pickle" in window.banner.text() and not window.snapshots.windows


def test_cancel_ends_the_reading_process(qtbot, make_window, tmp_path):
    window = make_window()
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    path = write(tmp_path / "big.pickle", random_snapshot(400_000, 5))
    window.snapshots.open(str(path))
    qtbot.waitUntil(lambda: window.snapshots._dialog.value() > 0, timeout=OPEN_TIMEOUT_MS)
    window.snapshots._dialog.findChild(QPushButton).click()  # the dialog's Cancel button
    qtbot.waitUntil(lambda: not window.snapshots.busy, timeout=OPEN_TIMEOUT_MS)
    assert not window.snapshots.windows
    qtbot.waitUntil(lambda: {p.pid for p in me.children(recursive=True)} <= before, timeout=5000)


def test_a_snapshot_dropped_on_the_window_opens(qtbot, make_window, tmp_path):
    window = make_window()
    path = write(tmp_path / "dropped.pickle", small_snapshot())
    data = QMimeData()
    data.setUrls([QUrl.fromLocalFile(str(path))])
    drop = QDropEvent(QPointF(10, 10), Qt.CopyAction, data, Qt.LeftButton, Qt.NoModifier)
    with qtbot.waitSignal(window.snapshots.opened, timeout=OPEN_TIMEOUT_MS) as signal:
        window.dropEvent(drop)
    qtbot.addWidget(signal.args[0])
    assert signal.args[0].index.meta["events"] == 10
    assert window.act_open_snapshot.shortcut().toString() == "Ctrl+Shift+M"
    assert MiB  # the helper's unit, used by the fixtures above


def test_a_second_snapshot_is_drawn_over_the_first_and_compared_by_line(qtbot, opened, tmp_path):
    window, snap = opened
    after = small_snapshot()
    for event in after["device_traces"][0]:
        if event["size"] == 8 * MiB:  # the gradient doubled
            event["size"] = 16 * MiB
    path = write(tmp_path / "after.pickle", after)
    assert snap.compare_button.isEnabled() and not snap.tabs.isTabEnabled(1)
    assert window.snapshots.open(str(path), compare_to=snap)
    qtbot.waitUntil(lambda: snap.other is not None, timeout=OPEN_TIMEOUT_MS)
    assert snap.tabs.isTabEnabled(1) and snap.tabs.currentIndex() == 1
    first = [snap.diff_table.item(0, c).text() for c in range(5)]
    assert first == ["main (train.py:50)", "8.00 MiB", "16.00 MiB", "+8.00 MiB", "gradient"]
    assert "(+8.00 MiB)" in snap.moment_label.text()
    compared = {i.name(): i for i in snap.plot.plotItem.listDataItems() if i.name()}
    # Drawn in the text colour (a white line vanished above the stacked areas on a light
    # palette), on the same axis as the first: its peak, 13.50 MiB with the gradient
    # grown by 8 MiB, reads 21.5 on the axis in MiB.
    pen = compared["compared: after.pickle"].opts["pen"]
    assert pen.color().name() == snap.palette().color(QPalette.Text).name()
    assert compared["compared: after.pickle"].yData.max() == pytest.approx(21.5)
    assert len(window.snapshots.windows) == 1  # compared in place, not a new window


def test_a_snapshot_of_many_gibibytes_is_drawn_in_gib(qtbot, make_window, tmp_path):
    """A 10 GiB peak read "10000" on an axis in MiB."""
    window = make_window()
    snap = open_snapshot(qtbot, window, write(tmp_path / "big.pickle", random_snapshot(60_000)))
    peak = snap.line.peak[0]
    assert peak > 1 << 30
    assert snap.plot.getAxis("left").labelText == "active memory (GiB)"
    top = max(i.yData.max() for i in snap.plot.plotItem.listDataItems() if i.name())
    assert top == pytest.approx(peak / (1 << 30))
    small = open_snapshot(qtbot, window, write(tmp_path / "small.pickle", small_snapshot()))
    assert small.plot.getAxis("left").labelText == "active memory (MiB)"


def test_the_segments_tab_draws_each_segment_block_by_block(qtbot, make_window, tmp_path):
    from snapshot_files import holed_segment_snapshot

    path = write(tmp_path / "segments.pickle", holed_segment_snapshot())
    snap = open_snapshot(qtbot, make_window(), path)
    snap.set_moment(int(snap.line.events[-1]))  # after the free: two blocks and a hole
    assert (snap.segment_map.rows, snap.segment_map.blocks) == (1, 2)
    assert "the largest free block 8.00 MiB" in snap.segments_label.text()
    labels = snap.segment_map.plot.getAxis("left")._tickLevels[0]
    assert labels[0][1] == "0x10000000 · 20.00 MiB"
    assert snap.segment_map.free_labels == ["largest free 8.00 MiB"]


def test_without_segment_events_the_segments_tab_says_why(opened):
    _, snap = opened
    assert snap.segment_map._stack.currentWidget() is snap.segment_map.message
    assert "records no segment events" in snap.segment_map.message.text()


def test_the_snapshot_command_opens_its_window_alone(qtbot, tmp_path):
    # `torchmem snapshot FILE`: the Snapshot window, not an empty main window behind it.
    from PySide6.QtWidgets import QApplication

    from torchmem.gui.app import SnapshotAlone
    from torchmem.gui.windows.main_window import MainWindow

    alone = SnapshotAlone(str(write(tmp_path / "alone.pickle", small_snapshot())))
    with qtbot.waitSignal(alone.opener.opened, timeout=OPEN_TIMEOUT_MS) as signal:
        pass
    snap = signal.args[0]
    qtbot.addWidget(snap)
    shown = [w for w in QApplication.topLevelWidgets() if w.isVisible()]
    assert snap in shown and not any(isinstance(w, MainWindow) for w in shown)
    assert "peak active 13.50 MiB" in snap.facts.text()
    # A file that is no snapshot: its reason in a message box, no window.
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle")
    failed = SnapshotAlone(str(bad))
    qtbot.waitUntil(lambda: failed.failure_box is not None and failed.failure_box.isVisible(),
                    timeout=OPEN_TIMEOUT_MS)  # fmt: skip
    assert "not a pickle" in failed.failure_box.text() and not failed.opener.windows
    with qtbot.waitSignal(failed.done) as done:
        failed.failure_box.close()
    assert done.args == [1], "the command exits 1 once the reason is read"


def test_zooming_in_draws_the_stretch_in_view_event_by_event(qtbot, make_window, tmp_path):
    # The whole trace is thinned to 4,000 points; zoomed to a few hundred events, every
    # one of them is drawn, with the stack's top at each event's exact active bytes.
    window = make_window()
    snap = open_snapshot(qtbot, window, write(tmp_path / "zoom.pickle", random_snapshot(60_000)))
    line, vb = snap.line, snap.plot.plotItem.vb
    top = snap.layers[-1][2]  # the uppermost band's upper edge: the total
    whole = len(top.xData)
    assert whole <= 4100 < len(line.time_us)
    t = (line.time_us - snap.t0) / 1e6
    a, b = 20_000, 20_200
    vb.setXRange(t[a], t[b], padding=0)
    qtbot.waitUntil(lambda: len(top.xData) < whole, timeout=5000)
    x, y = top.xData, top.yData
    inside = (t >= t[a]) & (t <= t[b])
    drawn = (x >= t[a]) & (x <= t[b])
    assert np.count_nonzero(drawn) == np.count_nonzero(inside) >= 200
    assert y[drawn] * snap.scale == pytest.approx(line.active[inside], rel=1e-9)
    # A pan of a fraction of the view stays within what was drawn: nothing is redone.
    drawn_before = snap.drawn
    vb.setXRange(t[a + 50], t[b + 50], padding=0)
    snap.refit_timer.timeout.emit()  # the view has rested
    assert snap.drawn == drawn_before and len(top.xData) < whole
    # Back to the data's whole range (the plot's "A" button): the whole trace again.
    vb.enableAutoRange()
    qtbot.waitUntil(lambda: len(top.xData) == whole, timeout=5000)
    assert snap.drawn is None
