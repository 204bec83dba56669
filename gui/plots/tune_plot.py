"""The Tune panel's plot: a search's reasoning drawn as it happens.

Every trial's peak against the batch size (log2 axis), the fitted memory model drawn out
to the budget with its band, the budget, limit and noise-margin lines, out-of-memory
trials as red crosses, peak allocated beside peak reserved on an accelerator, and
throughput on a right axis of its own with its knee. It only draws what it is given:
the panel owns the search and its state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import QWidget

from torchmem.gui.theme import follow_palette
from torchmem.tuning.model import Fit
from torchmem.tuning.search import Trial, TuneResult
from torchmem.units import UNITS, auto_unit

OK_COLOR, FAIL_COLOR, FIT_COLOR = "#1f77b4", "#d62728", "#7f7f7f"
BUDGET_COLOR, LIMIT_COLOR, RATE_COLOR, PICK_COLOR = "#d62728", "#ff7f0e", "#2ca02c", "#2ca02c"

TOOLTIP = (
    "Each dot is a trial: its peak memory at that batch size. The dashed curve is "
    "the fitted memory model (its band: ± the residuals), drawn out to the budget; "
    "red crosses ran out of memory or crossed the budget. On an accelerator the "
    "dots are peak reserved (what the budget is on) and the hollow dots peak "
    "allocated, with their own dotted model: the gap is the allocator's cache. The "
    "dash-dotted line sits two standard deviations of identical runs under the limit: "
    "the recommendation's peak stays below it, so that its next run fits too. "
    "Triangles: throughput (right axis), the circled one its knee."
)


#: The least height (px) at which the plot's axes and their titles fit.
MIN_HEIGHT = 172


class TunePlot(pg.PlotWidget):
    """Peaks, model, limits and throughput of one batch-size search."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # Tall enough for its axis title ("peak memory (MiB)", 130 px turned upright) and
        # the batch-size axis: in a short window it was squashed to 108 px, the title cut
        # to "eak memor". The table below it gives way first.
        self.setMinimumHeight(MIN_HEIGHT)
        item = self.getPlotItem()
        item.showGrid(x=True, y=True, alpha=0.2)
        item.setLabel("bottom", "batch size (log2 scale)")
        item.setMouseEnabled(y=False)
        self.ok_points = pg.ScatterPlotItem(size=9, brush=pg.mkBrush(OK_COLOR), pen=None)
        self.fail_points = pg.ScatterPlotItem(
            size=12, symbol="x", brush=pg.mkBrush(FAIL_COLOR), pen=pg.mkPen(FAIL_COLOR)
        )
        # Accelerators: peak allocated beside peak reserved (hollow dots, a dotted model);
        # the gap between the two is the allocator's cache.
        self.alloc_points = pg.ScatterPlotItem(
            size=8, brush=pg.mkBrush(None), pen=pg.mkPen(OK_COLOR, width=1.5)
        )
        self.alloc_curve = pg.PlotDataItem(pen=pg.mkPen(OK_COLOR, width=1, style=Qt.DotLine))
        self.fit_curve = pg.PlotDataItem(pen=pg.mkPen(FIT_COLOR, width=2, style=Qt.DashLine))
        self.band = pg.FillBetweenItem(
            pg.PlotDataItem(), pg.PlotDataItem(), brush=pg.mkBrush(127, 127, 127, 40)
        )
        # (angle, colour, pen style, width, label, where the label sits along the line)
        self.budget_line = _line(0, BUDGET_COLOR, Qt.DashLine, 1, "budget", 0.05)
        self.limit_line = _line(0, LIMIT_COLOR, Qt.DotLine, 1, "budget − headroom", 0.3)
        self.margin_line = _line(0, LIMIT_COLOR, Qt.DashDotLine, 1, "− noise margin", 0.75)
        self.total_line = _line(0, FIT_COLOR, Qt.SolidLine, 1, "device total", 0.55)
        self.predicted_line = _line(90, FIT_COLOR, Qt.DashLine, 1, "predicted", 0.95)
        self.pick_line = _line(90, PICK_COLOR, Qt.SolidLine, 2, "recommended", 0.85)
        for it in (
            self.band, self.fit_curve, self.alloc_curve, self.alloc_points, self.ok_points,
            self.fail_points,
        ):  # fmt: skip
            item.addItem(it)
        lines = (
            self.budget_line, self.limit_line, self.margin_line, self.total_line,
            self.predicted_line, self.pick_line,
        )  # fmt: skip
        for line in lines:
            item.addItem(line, ignoreBounds=line is not self.budget_line)
            line.hide()
        # Throughput on a right axis of its own, sharing the batch-size axis.
        self.rate_view = pg.ViewBox()
        item.showAxis("right")
        item.scene().addItem(self.rate_view)
        item.getAxis("right").linkToView(self.rate_view)
        item.getAxis("right").setLabel("samples/s", color=RATE_COLOR)
        self.rate_view.setXLink(item)
        self.rate_curve = pg.PlotDataItem(
            pen=pg.mkPen(RATE_COLOR, width=1), symbol="t", symbolSize=7,
            symbolBrush=RATE_COLOR, symbolPen=None,
        )  # fmt: skip
        self.knee_point = pg.ScatterPlotItem(
            size=16, symbol="o", pen=pg.mkPen(RATE_COLOR, width=2), brush=None
        )
        self.rate_view.addItem(self.rate_curve)
        self.rate_view.addItem(self.knee_point)
        item.vb.sigResized.connect(self._sync_rate_view)
        self.setToolTip(TOOLTIP)
        self.apply_palette()

    def apply_palette(self) -> None:
        """Follow the application's palette; the throughput axis keeps its green, the
        colour of the triangles it reads."""
        follow_palette(self)
        right = self.getPlotItem().getAxis("right")
        right.setTextPen(pg.mkPen(RATE_COLOR))
        right.setLabel("samples/s", color=RATE_COLOR)

    def draw(
        self,
        trials: Sequence[Trial],
        fit: Fit | None,
        result: TuneResult | None,
        budget: int | None,
        limit: int,
        device_total: int | None,
        sizes: tuple[int, int],
        planned: bool,
    ) -> None:
        """Draw a search so far: its ``trials``, the model ``fit`` after them, its
        ``result`` once it ended; ``budget`` and ``limit`` in bytes (``budget`` None while
        the form names none), the accelerator's total, and the form's range of ``sizes``
        (what the axis shows before any trial). The budget is drawn as a line once a
        search is ``planned``; before, it only sets the axis."""
        unit = auto_unit(budget) if budget else "MiB"
        scale = UNITS[unit]
        item = self.getPlotItem()
        if not trials:
            # No trials yet: from zero to the budget, not pyqtgraph's -0.4...0.4.
            item.setYRange(0, (budget or 1 << 30) * 1.05 / scale)
        item.setLabel("left", f"peak memory ({unit})")
        # A size that thrashed the allocator is drawn as failed, under the limit though it is.
        good = [t.ok and not t.thrashed and t.peak_bytes is not None for t in trials]
        ok = [t for t, g in zip(trials, good, strict=True) if g]
        bad = [t for t, g in zip(trials, good, strict=True) if not g]
        self.ok_points.setData(
            [math.log2(t.batch_size) for t in ok], [t.peak_bytes / scale for t in ok]
        )
        top = (budget or 0) if planned else 0
        self.fail_points.setData(
            [math.log2(t.batch_size) for t in bad],
            [(t.peak_bytes or top) / scale for t in bad],
        )
        allocated = [t for t in ok if t.peak_allocated_bytes is not None]
        self.alloc_points.setData(
            [math.log2(t.batch_size) for t in allocated],
            [t.peak_allocated_bytes / scale for t in allocated],
        )
        self._draw_fit(trials, fit, result, limit, sizes[1], scale)
        self._draw_rates(trials, result)
        margin = result.noise.margin if result is not None else 0.0
        for line, value in (
            (self.budget_line, top),
            (self.limit_line, limit),
            (self.margin_line, limit - margin if margin > 0 else 0),
            (self.total_line, device_total or 0),
        ):
            line.setVisible(bool(value))
            line.setValue(value / scale)
        for line, batch in (
            (self.predicted_line, result.predicted if result else None),
            (self.pick_line, result.recommended if result else None),
        ):
            line.setVisible(batch is not None)
            if batch is not None:
                line.setValue(math.log2(batch))
        # One line, one label, where the answer is what the model predicted: two labels
        # on one line ran into each other.
        same = result is not None and result.predicted == result.recommended
        self.predicted_line.label.setFormat("" if same else "predicted")
        self.pick_line.label.setFormat("recommended = predicted" if same else "recommended")
        tried = [t.batch_size for t in trials] + (
            [result.predicted] if result and result.predicted else []
        )
        hi = max([*tried, 2]) if tried else max(sizes[1], 2)
        lo = min([*tried, sizes[0]])
        ticks = [(k, f"{2**k:,}") for k in range(int(math.log2(lo)), int(math.log2(hi)) + 2)]
        item.getAxis("bottom").setTicks([ticks])
        item.setXRange(math.log2(lo) - 0.3, math.log2(hi) + 0.3)

    def _draw_fit(
        self,
        trials: Sequence[Trial],
        fit: Fit | None,
        result: TuneResult | None,
        limit: int,
        largest: int,
        scale: float,
    ) -> None:
        if fit is None or not trials:
            self.fit_curve.setData([], [])
            self.alloc_curve.setData([], [])
            self.band.curves[0].setData([], [])
            self.band.curves[1].setData([], [])
            return
        sizes = [t.batch_size for t in trials]
        reach = fit.largest_under(limit) or max(sizes)
        right = max(max(sizes), min(reach * 1.3, largest * 2))
        xs = np.exp2(np.linspace(math.log2(min(sizes)), math.log2(max(right, 2)), 120))
        ys = np.array([fit.peak(x) for x in xs])
        self.fit_curve.setData(np.log2(xs), ys / scale)
        allocated = result.fit_allocated if result else None
        if allocated is not None:
            self.alloc_curve.setData(np.log2(xs), np.array([allocated.peak(x) for x in xs]) / scale)
        else:
            self.alloc_curve.setData([], [])
        band = 2 * fit.rms_residual
        self.band.curves[0].setData(np.log2(xs), (ys - band) / scale)
        self.band.curves[1].setData(np.log2(xs), (ys + band) / scale)

    def _draw_rates(self, trials: Sequence[Trial], result: TuneResult | None) -> None:
        runs: dict[int, list[float]] = {}
        for t in trials:
            if t.samples_per_s and t.ok:
                runs.setdefault(t.batch_size, []).append(t.samples_per_s)
        # One point per size, the median of its runs: repeats of a size drew the line up
        # and down on one spot.
        rated = sorted((b, float(np.median(r))) for b, r in runs.items())
        self.rate_curve.setData([math.log2(b) for b, _ in rated], [r for _, r in rated])
        knee = result.knee if result else None
        rates = dict(rated)
        if knee in rates:
            self.knee_point.setData([math.log2(knee)], [rates[knee]])
        else:
            self.knee_point.setData([], [])
        if rated:
            self.rate_view.setYRange(0, max(r for _, r in rated) * 1.15)

    @Slot()
    def _sync_rate_view(self) -> None:
        item = self.getPlotItem()
        self.rate_view.setGeometry(item.vb.sceneBoundingRect())
        self.rate_view.linkedViewChanged(item.vb, self.rate_view.XAxis)


def _line(
    angle: int, color: str, style: Qt.PenStyle, width: int, label: str, position: float
) -> pg.InfiniteLine:
    """A labelled horizontal (0) or vertical (90) marker line of the plot."""
    return pg.InfiniteLine(
        angle=angle,
        pen=pg.mkPen(color, style=style, width=width),
        label=label,
        # A vertical line's label to its left: the largest size sits at the plot's right
        # edge, which cut a centred label off.
        labelOpts={"position": position, "color": color, "anchors": [(0.5, 0), (1, 0.5)]},
    )
