"""The Snapshot window: a PyTorch memory snapshot, read in a worker process and drawn
from its index.

Active memory over time, stacked by what it probably is (parameters, optimizer state,
gradients, activations, other), with a moment (the peak, at first) and a time range that
narrow the rest; the allocations live at that moment grouped by the line that made them,
each with its full stack; the allocator's segments at the end. Built on
:mod:`torchmem.snapshots` (no Qt there), which memory_viz users will recognise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, QThread, QTimer, Signal, Slot
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGraphicsItem,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QProgressDialog,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from torchmem.gui.plots.segment_map import SegmentMap
from torchmem.gui.theme import follow_palette
from torchmem.gui.workers import Worker, start_in_thread, wait_thread
from torchmem.snapshots import analysis
from torchmem.snapshots.index import SnapshotIndex
from torchmem.snapshots.open import SnapshotCancelled, open_snapshot
from torchmem.snapshots.read import SnapshotError
from torchmem.units import UNITS, auto_unit, format_bytes

#: Stacked from the bottom: what stays (parameters) under what comes and goes.
CATEGORY_COLORS = {
    "parameter": "#4e79a7",
    "optimizer state": "#f28e2c",
    "gradient": "#59a14f",
    "activation": "#e15759",
    "other": "#bab0ab",
}
COLUMNS = ("Allocated by", "Bytes", "Allocations", "Kind", "Tensors")
#: Names shown in a row of the Tensors column (all of them in its tooltip).
NAMES_SHOWN = 3
DIFF_COLUMNS = ("Allocated by", "Here", "Compared", "Change", "Kind")
MiB = 1 << 20
#: Points drawn per curve, for the whole trace or the stretch in view.
POINTS = 4000
#: How long the view must rest after a zoom or pan before the curves are thinned again
#: for what it shows (ms): a pan is drawn from the pixmaps meanwhile.
REFIT_MS = 150


def _cached(item: QGraphicsItem) -> QGraphicsItem:
    """``item`` painted once into a pixmap that a pan shifts rather than paints again: a
    filled band of thousands of points took 30 ms a frame to fill (14 frames/s panning
    ten million events; 51 with the fills cached). Qt paints it again when its data or
    the zoom changes."""
    item.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
    return item


def _positions(times: np.ndarray, start_us: float, end_us: float) -> tuple[int, int]:
    """The first and last positions of sorted ``times`` that a view from ``start_us`` to
    ``end_us`` needs: those inside it, and one more on each side, so that the curves
    reach the view's edges."""
    lo = int(np.searchsorted(times, start_us, side="left")) - 1
    hi = int(np.searchsorted(times, end_us, side="right"))
    return max(lo, 0), min(hi, len(times) - 1)


class SnapshotLoader(Worker):
    """Opens one snapshot in its own thread (the reading itself is in a worker process).

    ``finished`` carries the index, or None (then ``failed`` said why, or it was
    cancelled, which needs no words: the user pressed Cancel)."""

    progress = Signal(float)
    failed = Signal(str)
    cancelled = (SnapshotCancelled,)
    known = (SnapshotError,)

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.failed_text = f"cannot open {path}"

    def work(self) -> SnapshotIndex:
        """Open the snapshot: read, indexed, its names matched."""
        return open_snapshot(self.path, self.progress.emit, self.cancel_event)

    def report_known(self, exc: BaseException) -> None:
        """Why the file could not be read, as the reader says it."""
        self.failed.emit(str(exc))

    def report_bug(self, text: str) -> None:
        """torchmem's own failure, in the same place as a reading's."""
        self.failed.emit(text)


class SnapshotWindow(QMainWindow):
    """One snapshot: timeline, the live set at a moment, stacks, segments."""

    def __init__(
        self,
        index: SnapshotIndex,
        parent: QWidget | None = None,
        opener: SnapshotOpener | None = None,
    ) -> None:
        super().__init__(parent)
        self.index = index
        self.opener = opener
        self.other: SnapshotIndex | None = None
        self.end_segments = ""
        self.groups: list[analysis.StackGroup] = []
        self.scale = MiB  # bytes per unit of the plot's y axis (GiB above 1 GiB)
        name = Path(index.meta.get("file", "snapshot")).name
        self.setWindowTitle(f"Memory snapshot – {name}")
        self.resize(1250, 800)
        self.device_combo = QComboBox()
        for device in index.devices:
            self.device_combo.addItem(f"cuda:{device}", device)
        self.device_combo.setToolTip("The device whose trace is shown")
        self.device_combo.currentIndexChanged.connect(self._show_device)
        self.facts = QLabel()
        self.facts.setTextInteractionFlags(Qt.TextSelectableByMouse)
        top = QHBoxLayout()
        top.addWidget(QLabel("Device:"))
        top.addWidget(self.device_combo)
        top.addWidget(self.facts, 1)
        self.compare_button = QPushButton("Compare with…")
        self.compare_button.setToolTip(
            "Open a second snapshot (after a change, another batch size): its active memory "
            "drawn over this one, aligned at the first event, and what each line held at "
            "each peak"
        )
        self.compare_button.clicked.connect(self._choose_other)
        self.compare_button.setEnabled(opener is not None)
        top.addWidget(self.compare_button)

        self.plot = pg.PlotWidget()
        self.plot.getAxis("left").enableAutoSIPrefix(False)  # binary units, not decimal SI
        self.plot.setLabel("bottom", "time since the first event", units="s")
        # Panned or scrolled, the plot must keep up (issue 33: 60 frames/s on ten million
        # events): a vertical grid moves with the time axis and is drawn again each frame
        # (51 -> 105 frames/s without it); the y axis, which panning does not move, and
        # the stacked fills (_cached) are kept as pixmaps that a pan only shifts.
        self.plot.showGrid(x=False, y=True, alpha=0.25)
        self.plot.getAxis("left").setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.plot.addLegend(offset=(10, 5))
        follow_palette(self.plot)
        self.plot.setToolTip(
            "Allocated bytes after each event, stacked by what the allocating stack looks "
            "like. Click to choose a moment; drag the shaded range's edges to narrow it."
        )
        self.region = pg.LinearRegionItem(brush=pg.mkBrush(120, 120, 120, 30))
        self.region.setZValue(-10)
        self.region.sigRegionChangeFinished.connect(self._on_region)
        self.moment_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#d62728", width=2))
        self.plot.scene().sigMouseClicked.connect(self._on_click)
        # Zoomed in, the curves are thinned again for the stretch in view, once the view
        # rests: the whole trace's 4,000 points leave a tenth of it 400.
        self.layers: list[tuple[str, pg.PlotCurveItem, pg.PlotCurveItem]] = []
        self.compared: tuple[analysis.Timeline, int, pg.PlotCurveItem] | None = None
        self.drawn: tuple[int, int] | None = None  # the line's positions drawn; None: all
        self.refit_timer = QTimer(self)
        self.refit_timer.setSingleShot(True)
        self.refit_timer.setInterval(REFIT_MS)
        self.refit_timer.timeout.connect(self._refit)
        self.plot.plotItem.vb.sigXRangeChanged.connect(self.refit_timer.start)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        for col in range(1, len(COLUMNS)):
            self.table.horizontalHeader().setSectionResizeMode(col, QHeaderView.ResizeToContents)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.setToolTip("Allocations live at the chosen moment, by the line that made them")
        self.table.horizontalHeaderItem(len(COLUMNS) - 1).setToolTip(
            "The tensors these allocations held, from the censuses torchmem took in the run "
            "that saved the snapshot (matched by address, at a moment both were live)"
        )
        # Only snapshots torchmem saved during a run with censuses have names.
        self.table.setColumnHidden(len(COLUMNS) - 1, not index.tensor_names)
        self.table.currentCellChanged.connect(self._show_stack)
        self.stack_view = QPlainTextEdit()
        self.stack_view.setReadOnly(True)
        self.stack_view.setPlaceholderText("Select a row to see its stack (innermost first)")
        self.segments_label = QLabel()
        self.segments_label.setWordWrap(True)
        right = QVBoxLayout()
        right.addWidget(QLabel("Stack of the largest allocation of the selected row:"))
        right.addWidget(self.stack_view, 1)
        right.addWidget(self.segments_label)
        right_box = QWidget()
        right_box.setLayout(right)
        self.diff_table = QTableWidget(0, len(DIFF_COLUMNS))
        self.diff_table.setHorizontalHeaderLabels(DIFF_COLUMNS)
        self.diff_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        for col in range(1, len(DIFF_COLUMNS)):
            self.diff_table.horizontalHeader().setSectionResizeMode(
                col, QHeaderView.ResizeToContents
            )
        self.diff_table.verticalHeader().setVisible(False)
        self.diff_table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.table, "Live at the moment")
        self.tabs.addTab(self.diff_table, "Compared at the peaks")
        self.tabs.setTabEnabled(1, False)
        self.segment_map = SegmentMap(CATEGORY_COLORS)
        self.tabs.addTab(self.segment_map, "Segments at the moment")
        lower = QSplitter(Qt.Horizontal)
        lower.addWidget(self.tabs)
        lower.addWidget(right_box)
        lower.setSizes([700, 500])
        body = QSplitter(Qt.Vertical)
        body.addWidget(self.plot)
        body.addWidget(lower)
        body.setSizes([420, 340])
        self.moment_label = QLabel()
        layout = QVBoxLayout()
        layout.addLayout(top)
        layout.addWidget(body, 1)
        layout.addWidget(self.moment_label)
        central = QWidget()
        central.setLayout(layout)
        self.setCentralWidget(central)
        self._show_device()

    # -- what it shows --------------------------------------------------------------------------
    @property
    def device(self) -> int:
        """The device shown."""
        data = self.device_combo.currentData()
        return int(data) if data is not None else 0

    @Slot()
    def _show_device(self) -> None:
        index, device = self.index, self.device
        self.line = analysis.timeline(index, device)
        self.stacked = analysis.stacked_curves(index, device, POINTS, line=self.line)
        times, curves, _ = self.stacked.whole()
        self.t0 = int(self.line.time_us[0]) if len(self.line.time_us) else 0
        self.plot.clear()
        if self.plot.plotItem.legend is not None:
            self.plot.plotItem.legend.clear()
        # A 10 GiB peak read "10000" in MiB: the axis takes the unit the peak reads in.
        unit = auto_unit(self.line.peak[0]) if self.line.peak[0] >= MiB else "MiB"
        self.scale = UNITS[unit]
        self.plot.setLabel("left", f"active memory ({unit})")
        self.layers, self.compared, self.drawn = [], None, None
        for cat, color in CATEGORY_COLORS.items():
            if curves[cat].any():
                low = pg.PlotCurveItem(pen=pg.mkPen(color, width=0))
                high = pg.PlotCurveItem(pen=pg.mkPen(color, width=1), name=cat)
                fill = pg.mkColor(color)
                fill.setAlpha(170)
                self.plot.addItem(_cached(pg.FillBetweenItem(low, high, brush=pg.mkBrush(fill))))
                self.plot.addItem(_cached(high))
                self.layers.append((cat, low, high))
        self._draw_layers(times, curves)
        seg = analysis.segments(index, device)
        self.end_segments = (
            f"At the end: {seg.segments} segments, {format_bytes(seg.reserved)} reserved, "
            f"{format_bytes(seg.allocated)} allocated; {seg.fragmentation:.0%} of reserved "
            f"is free, {format_bytes(seg.inactive_split)} of it in split segments (free, yet "
            "unusable for a request larger than its pieces)."
        )
        self.plot.addItem(self.region)
        self.plot.addItem(self.moment_line)
        if len(self.line.time_us):  # the whole trace
            self.region.setRegion((0.0, float(self.line.time_us[-1] - self.t0) / 1e6))
        peak, when, event = self.line.peak
        self.facts.setText(
            f"{index.meta.get('events', 0):,} events · peak active {format_bytes(peak)} at "
            f"{(when - self.t0) / 1e6:.3f} s · at the end {format_bytes(seg.reserved)} "
            f"reserved in {seg.segments} segments"
            + (f" · {len(index.tensor_names):,} allocations named by the run's censuses"
               if index.tensor_names else "")
            + (f" · {index.meta['names_note']}" if index.meta.get("names_note") else "")
        )  # fmt: skip
        self.set_moment(event)

    def set_moment(self, event: int) -> None:
        """Show what was live just after event row ``event`` (-1: before the trace)."""
        self.moment = event
        if 0 <= event < len(self.index.ev_time):
            when = int(self.index.ev_time[event])
            active = self.line.active[np.searchsorted(self.line.events, event)]
        else:
            when, active = self.t0, self.line.initial
        self.moment_line.setValue((when - self.t0) / 1e6)
        live = analysis.live_at(self.index, self.device, event)
        self.groups = analysis.by_owner(self.index, live, top=None)
        self.table.setRowCount(len(self.groups))
        for row, g in enumerate(self.groups):
            shown = ", ".join(g.tensors[:NAMES_SHOWN])
            if len(g.tensors) > NAMES_SHOWN:
                shown += f" +{len(g.tensors) - NAMES_SHOWN} more"
            cells = (g.frame, format_bytes(g.bytes), f"{g.count:,}", g.category, shown)
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col in (1, 2):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if col == 0:
                    item.setToolTip("\n".join(g.stack))
                if col == 4 and g.tensors:
                    item.setToolTip("\n".join(g.tensors))
                self.table.setItem(row, col, item)
        self.moment_label.setText(
            f"At {(when - self.t0) / 1e6:.6f} s: {format_bytes(int(active))} active in "
            f"{len(live):,} allocations, by {len(self.groups):,} lines"
        )
        self._show_segments(event)
        if self.groups:
            self.table.selectRow(0)

    def _show_segments(self, event: int) -> None:
        """The allocator's segments at the moment (from the trace's segment events)."""
        traced = analysis.traces_segments(self.index, self.device)
        segs = analysis.segments_at(self.index, self.device, event) if traced else []
        if traced:
            self.segment_map.show_segments(segs)
        else:
            self.segment_map.show_message(
                "This snapshot's trace records no segment events, so the allocator's state "
                "can only be told at the end (beside). Record history with "
                "torch.cuda.memory._record_memory_history() before the segments are made "
                "(at the start of the run) to see them at any moment."
            )
        if not segs:
            self.segments_label.setText(self.end_segments)
            return
        reserved = sum(s.size for s in segs)
        allocated = sum(s.allocated for s in segs)
        largest = max(s.largest_free for s in segs)
        self.segments_label.setText(
            f"Allocator at the moment: {len(segs)} segments, {format_bytes(reserved)} "
            f"reserved, {format_bytes(allocated)} allocated, {format_bytes(reserved - allocated)}"
            f" free in them, the largest free block {format_bytes(largest)}: a larger "
            "request needs a new segment from the device (or fails). " + self.end_segments
        )

    @Slot()
    def _choose_other(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Compare with a snapshot", "", "Snapshots (*.pickle *.pkl);;All files (*)"
        )
        if path and self.opener is not None:
            self.opener.open(path, compare_to=self)

    def compare_with(self, other: SnapshotIndex) -> None:
        """Draw ``other``'s active memory over this one's (aligned at the first event),
        and fill the table of what each line held at each peak."""
        self.other = other
        device = self.device if self.device in other.devices else min(other.devices or [0])
        line = analysis.timeline(other, device)
        start = int(line.time_us[0]) if len(line.time_us) else 0
        name = Path(other.meta.get("file", "other")).name
        curve = pg.PlotCurveItem(
            # In the text colour: white vanished above the stacked areas on a light palette.
            pen=pg.mkPen(self.palette().color(QPalette.Text), width=2, style=Qt.DashLine),
            name=f"compared: {name}",
        )
        self.plot.addItem(_cached(curve))
        self.compared = (line, start, curve)
        self._draw_compared(None)
        mine, theirs, diffs = analysis.compare_peaks(self.index, other, device)
        self.diff_table.setRowCount(len(diffs))
        for row, d in enumerate(diffs):
            cells = (
                d.frame, format_bytes(d.before), format_bytes(d.after),
                format_bytes(d.change, signed=True), d.category,
            )  # fmt: skip
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if 1 <= col <= 3:
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.diff_table.setItem(row, col, item)
        self.tabs.setTabEnabled(1, True)
        self.tabs.setCurrentIndex(1)
        self.moment_label.setText(
            f"Peak active: {format_bytes(mine)} here, {format_bytes(theirs)} in {name} "
            f"({format_bytes(theirs - mine, signed=True)})"
        )

    def _draw_layers(self, times: np.ndarray, curves: dict[str, np.ndarray]) -> None:
        """The stacked bands at ``times`` (µs), each category on those below it."""
        x = (times - self.t0) / 1e6
        below = np.zeros(len(x))
        for cat, low, high in self.layers:
            above = below + curves[cat] / self.scale
            low.setData(x, below)
            high.setData(x, above)
            below = above

    def _draw_compared(self, window: tuple[float, float] | None) -> None:
        """The compared snapshot's curve: whole, or thinned for ``window`` (seconds since
        its first event, a view's width more each side)."""
        if self.compared is None:
            return
        line, start, curve = self.compared
        lo, hi = 0, len(line.active) - 1
        if window is not None:
            lo, hi = _positions(line.time_us, start + window[0] * 1e6, start + window[1] * 1e6)
        keep = lo + analysis.thin(line.active[lo : hi + 1], POINTS)
        curve.setData((line.time_us[keep] - start) / 1e6, line.active[keep] / self.scale)

    @Slot()
    def _refit(self) -> None:
        """Thin the curves again for the stretch in view, once the view rests after a zoom
        or pan: a view's width more on each side, so that a short pan needs nothing new.
        Where the view shows most of the trace, or follows the data (auto range), the
        whole trace is drawn."""
        n = len(self.line.time_us)
        if n <= POINTS and self.compared is None:
            return  # every event is drawn already
        vb = self.plot.plotItem.vb
        x0, x1 = vb.viewRange()[0]
        width = x1 - x0
        seen = _positions(self.line.time_us, self.t0 + x0 * 1e6, self.t0 + x1 * 1e6)
        wanted = _positions(
            self.line.time_us, self.t0 + (x0 - width) * 1e6, self.t0 + (x1 + width) * 1e6
        )
        follows = bool(vb.autoRangeEnabled()[0])
        if follows or wanted[1] - wanted[0] + 1 >= n // 2:
            if self.drawn is not None:
                self.drawn = None
                self._draw_layers(*self.stacked.whole()[:2])
                self._draw_compared(None)
            return
        if self.drawn is not None:
            lo, hi = self.drawn
            inside = lo <= seen[0] and seen[1] <= hi
            if inside and hi - lo < 4 * (seen[1] - seen[0] + 1):
                return  # what is drawn covers the view, at enough points for it
        self.drawn = wanted
        self._draw_layers(*self.stacked.between(*wanted, POINTS)[:2])
        self._draw_compared((x0 - width, x1 + width))

    @Slot(int, int, int, int)
    def _show_stack(self, row: int, *_: int) -> None:
        if 0 <= row < len(self.groups):
            g = self.groups[row]
            text = "\n".join(g.stack) or "(no stack was recorded)"
            if g.tensors:
                text = "Tensors: " + ", ".join(g.tensors) + "\n\n" + text
            self.stack_view.setPlainText(text)

    @Slot(object)
    def _on_click(self, event: object) -> None:
        pos = event.scenePos()  # type: ignore[attr-defined]
        if not self.plot.sceneBoundingRect().contains(pos):
            return
        x = self.plot.plotItem.vb.mapSceneToView(pos).x()
        self.set_moment(self._event_at(self.t0 + x * 1e6))

    def _event_at(self, time_us: float) -> int:
        """The last event of the device at or before ``time_us``."""
        times = self.line.time_us
        i = int(np.searchsorted(times, time_us, side="right")) - 1
        return int(self.line.events[i]) if i >= 0 else -1

    @Slot()
    def _on_region(self) -> None:
        """The moment becomes the peak within the range."""
        lo, hi = self.region.getRegion()
        times = (self.line.time_us - self.t0) / 1e6
        inside = np.flatnonzero((times >= lo) & (times <= hi))
        if len(inside):
            best = inside[int(np.argmax(self.line.active[inside]))]
            self.set_moment(int(self.line.events[best]))


class SnapshotOpener(QObject):
    """Opens snapshots for a parent window: a progress dialog with Cancel, then a window
    (or the reason in a message box)."""

    opened = Signal(object)  # the SnapshotWindow
    failed = Signal(str)
    #: A reading ended: True when it opened a window (or compared), False when it failed
    #: or was cancelled.
    ended = Signal(bool)

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.parent_widget = parent
        self.windows: list[SnapshotWindow] = []
        self._thread: QThread | None = None
        self._loader: SnapshotLoader | None = None
        self._dialog: QProgressDialog | None = None
        self._compare_to: SnapshotWindow | None = None

    @property
    def busy(self) -> bool:
        """True while a snapshot is being read."""
        return self._thread is not None

    def open(self, path: str, compare_to: SnapshotWindow | None = None) -> bool:
        """Start reading ``path`` (for a window of its own, or to be compared in
        ``compare_to``); False if another is being read."""
        if self.busy:
            return False
        self._compare_to = compare_to
        dialog = QProgressDialog(
            f"Reading {Path(path).name}…", "Cancel", 0, 1000, self.parent_widget
        )
        dialog.setWindowTitle("Open memory snapshot")
        dialog.setMinimumDuration(300)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        loader = SnapshotLoader(path)
        # Slots of this object (in the GUI thread): queued, never run in the loader's.
        loader.progress.connect(self._on_progress)
        loader.failed.connect(self._on_failed)
        loader.finished.connect(self._on_finished)
        dialog.canceled.connect(loader.cancel_event.set)
        self._dialog, self._loader = dialog, loader
        self._thread = start_in_thread(loader, "torchmem-snapshot", loader.run, loader.finished)
        return True

    @Slot(float)
    def _on_progress(self, share: float) -> None:
        if self._dialog is not None:
            self._dialog.setValue(int(share * 1000))

    @Slot(str)
    def _on_failed(self, text: str) -> None:
        self.failed.emit(text)

    @Slot(object)
    def _on_finished(self, index: SnapshotIndex | None) -> None:
        if self._thread is not None:
            wait_thread(self._thread, 5000)
        self._thread = self._loader = None
        if self._dialog is not None:
            self._dialog.close()
            self._dialog.deleteLater()
            self._dialog = None
        target, self._compare_to = self._compare_to, None
        if index is not None and target is not None:
            target.compare_with(index)
        elif index is not None:
            window = SnapshotWindow(index, opener=self)
            self.windows.append(window)
            window.show()
            self.opened.emit(window)
        self.ended.emit(index is not None)

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """Cancel a reading in progress and wait for its thread."""
        if self._loader is not None:
            self._loader.cancel_event.set()
        if self._thread is None:
            return True
        done = wait_thread(self._thread, timeout_ms)
        if done:
            self._thread = None
        return done
