"""The Compare window: two or more recorded runs, one trace of each on one plot, a table of
their figures side by side (before and after a fix, two batch sizes, two settings)."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from torchmem.gui.forms import read_only_table
from torchmem.gui.theme import follow_palette
from torchmem.record.compare import (
    CompareRow,
    aligned,
    common_keys,
    compare_row,
    peak_keys,
    run_labels,
)
from torchmem.record.replay import Recording
from torchmem.report.recorded import recorded_summary
from torchmem.series import series_label
from torchmem.session import peak_label
from torchmem.units import UNITS, auto_unit, format_bytes, format_duration

#: One color per run, in order (colour-blind safe: Okabe-Ito).
RUN_COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")


class CompareWindow(QDialog):
    """Shows the recordings given, already read (see :func:`torchmem.record.replay.load`)."""

    def __init__(self, recordings: list[Recording], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.recordings = recordings
        self.labels = run_labels(recordings)
        self.rows: list[CompareRow] = [
            compare_row(r, recorded_summary(r), label)
            for r, label in zip(recordings, self.labels, strict=True)
        ]
        self.setWindowTitle("Compare runs – " + " vs ".join(row.name for row in self.rows))
        self.resize(1200, 760)

        self.series_combo = QComboBox()
        self.series_combo.setToolTip("The trace of every run to overlay (series they all have)")
        for key in common_keys(recordings):
            self.series_combo.addItem(series_label(key), key)
        self.axis_combo = QComboBox()
        self.axis_combo.addItem("seconds since the start", "time")
        self.axis_combo.addItem("training steps", "steps")
        self.axis_combo.setToolTip(
            "Align the runs by time since each one started, or by training step (runs "
            "with different step times line up step by step)"
        )
        controls = QHBoxLayout()
        controls.addWidget(QLabel("Trace:"))
        controls.addWidget(self.series_combo, 1)
        controls.addWidget(QLabel("X axis:"))
        controls.addWidget(self.axis_combo)

        self.plot = pg.PlotWidget()
        self.plot.showGrid(x=True, y=True, alpha=0.25)
        follow_palette(self.plot)  # the application's light or dark palette
        self.plot.addLegend(offset=(10, 10))
        self._build_table()

        splitter = QSplitter(Qt.Vertical)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addLayout(controls)
        top_layout.addWidget(self.plot, 1)
        splitter.addWidget(top)
        splitter.addWidget(self.table)
        splitter.setSizes([520, 200])
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(buttons)

        self.series_combo.currentIndexChanged.connect(lambda _i: self.redraw())
        self.axis_combo.currentIndexChanged.connect(lambda _i: self.redraw())
        self.redraw()

    def _build_table(self) -> None:
        devices = peak_keys(self.rows)
        columns = [
            ("Run", "The recording's file name (hover a name for its path)"),
            ("Recorded", "When the run was recorded"),
            ("Ended", "How the run ended"),
            ("Duration", "Wall time from the first sample to the last"),
            ("Steps", "Training steps the run reported"),
            ("Step time", "Median time of one step, the first left out (it warms caches up)"),
        ]
        columns += [
            (
                f"Peak {peak_label(d)}",
                f"Highest {peak_label(d)} reading of the run (change from the first run)",
            )
            for d in devices
        ]
        columns += [
            ("Alerts", "Memory alerts raised"),
            (
                "Allocator settings",
                "The allocator variables (PYTORCH_*_ALLOC_CONF) the run started with",
            ),
        ]
        headers, tips = zip(*columns, strict=True)
        self.table = read_only_table(list(headers), tips, stretch=len(columns) - 1)
        self.table.setRowCount(len(self.rows))
        first = self.rows[0] if self.rows else None
        for r, row in enumerate(self.rows):
            cells = [
                row.name, row.created, row.status, format_duration(row.duration_s),
                f"{row.steps:,}",
                f"{row.step_time_s * 1000:.1f} ms" if row.step_time_s else "-",
            ]  # fmt: skip
            for device in devices:
                value = row.peaks.get(device)
                text = format_bytes(value) if value is not None else "-"
                base = first.peaks.get(device) if first is not None else None
                if r > 0 and value is not None and base:
                    text += f" ({100 * (value - base) / base:+.0f}%)"
                cells.append(text)
            cells.append(str(row.alerts))
            cells.append(", ".join(f"{k}={v}" for k, v in row.allocator.items()) or "defaults")
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c == 0:
                    item.setForeground(pg.mkColor(RUN_COLORS[r % len(RUN_COLORS)]))
                    item.setToolTip(str(self.recordings[r].path))
                elif c >= 3 and c < len(cells) - 1:
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(r, c, item)
        self.table.setToolTip("Peaks of the later runs also read as a change from the first run's")

    @Slot()
    def redraw(self) -> None:
        """Draw the chosen trace of every run against the chosen axis."""
        key = self.series_combo.currentData()
        axis = self.axis_combo.currentData()
        item = self.plot.getPlotItem()
        item.clear()
        if item.legend is not None:
            item.legend.clear()
        if key is None:
            item.setTitle("These runs share no trace")
            return
        curves = [aligned(r, key, axis) for r in self.recordings]
        top = max((float(v.max()) for _, v in curves if len(v)), default=1.0)
        unit = auto_unit(top)
        for i, ((x, v), label) in enumerate(zip(curves, self.labels, strict=True)):
            item.plot(
                x, v / UNITS[unit], name=label,
                pen=pg.mkPen(RUN_COLORS[i % len(RUN_COLORS)], width=2),
            )  # fmt: skip
        item.setTitle(series_label(key), color=self.palette().color(QPalette.Text).name())
        item.setLabel("left", f"memory ({unit})")
        item.setLabel("bottom", "training step" if axis == "steps" else "time since start (s)")
