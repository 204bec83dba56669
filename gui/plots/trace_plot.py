"""Live memory traces: accelerator and host memory over time or steps, with markers.

Curves are created once per series and updated with ``setData`` on numpy arrays, with
peak-preserving downsampling and clip-to-view. Data is pulled from the Session when the
bridge says it changed (at most ~30 Hz), never pushed from other threads.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal, Slot
from PySide6.QtGui import QPalette, QPen, QResizeEvent
from PySide6.QtWidgets import QGraphicsItem, QWidget

from torchmem.gui.bridge import SessionBridge
from torchmem.gui.plots.job_legend import JobLegend
from torchmem.gui.plots.plot_markers import MarkerLines
from torchmem.gui.plots.series_style import HIDDEN_BY_DEFAULT, curve_style, series_color
from torchmem.gui.theme import follow_palette
from torchmem.gui.view_state import WINDOWS, ViewState
from torchmem.series import METRICS, SeriesName
from torchmem.session import Session
from torchmem.units import UNITS, auto_unit, format_bytes

MAX_STEP_TICKS = 400
#: The legend's columns when the width allows (fewer in a narrow window).
LEGEND_COLUMNS = 4
#: Above this many points in view a trace is drawn 1 px wide instead of 2: Qt's raster
#: engine draws wide lines segment by segment, and 8 dense wide traces took 107 ms a frame
#: (9 frames/s) against 40-70 ms at 1 px (benchmarks/gui_speed.py). A dense trace looks
#: the same thin; a sparse one keeps its weight.
DENSE_POINTS = 1500


def plot_group(name: SeriesName) -> str:
    """Which plot a series goes to: ``host`` for cpu/system, else ``accelerator``."""
    return "host" if name.host else "accelerator"


class TracePlot(pg.GraphicsLayoutWidget):
    """Accelerator and host memory plots over a step strip, sharing one X axis."""

    #: Follow mode was turned off because the user panned or zoomed.
    follow_changed = Signal(bool)

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent=parent)
        self.session = session
        self.x_mode = "time"
        self.unit = "auto"
        self.follow = True
        self.scope: str | None = None  # one rank of a job, or None for every series
        self.window_s: float | None = 120.0
        self.paused = False
        self.samples_drawn = 0
        self._shown_units: dict[str, str] = {}
        self._curves: dict[str, pg.PlotDataItem] = {}
        self._xy: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        #: What each curve was last given (length, ends, scale): unchanged data is skipped.
        self._drawn: dict[str, tuple] = {}
        self._setting_range = False

        # The legend gets its own row so that it never hides a trace; click an entry to
        # hide or show that trace.
        self.legend = pg.LegendItem(colCount=LEGEND_COLUMNS, labelTextSize="9pt", horSpacing=18)
        self.addItem(self.legend, row=0, col=0)
        # A job's traces are listed by process and by metric, not one by one.
        self.job_legend = JobLegend(self.legend, self._apply_job_legend)
        self.readout = pg.LabelItem(
            "Hover over the traces to read every value", justify="left", size="9pt"
        )
        self.addItem(self.readout, row=1, col=0)
        self.ci.layout.setRowMaximumHeight(0, 30)
        self.ci.layout.setRowMaximumHeight(1, 22)
        self.plots: dict[str, pg.PlotItem] = {}
        for row, (group, title) in enumerate(
            (("accelerator", "Accelerator memory"), ("host", "Host memory")), start=2
        ):
            plot = self.addPlot(row=row, col=0, title=title)
            plot.showGrid(x=True, y=True, alpha=0.25)
            plot.setClipToView(True)
            plot.setDownsampling(auto=True, mode="peak")
            plot.setLabel("left", "memory", units=None)
            plot.getAxis("left").setWidth(70)
            # Units are ours (MiB, GiB): pyqtgraph's SI scaling would add "(x0.001)".
            plot.getAxis("left").enableAutoSIPrefix(False)
            plot.vb.sigRangeChangedManually.connect(self._user_moved)
            self.plots[group] = plot
        self.plots["accelerator"].setVisible(False)
        self.steps_plot = self.addPlot(row=4, col=0)
        self.steps_plot.setMaximumHeight(80)
        self.steps_plot.setYRange(0, 1, padding=0)
        self.steps_plot.setMouseEnabled(y=False)
        left = self.steps_plot.getAxis("left")
        left.setWidth(70)
        left.setStyle(showValues=False, tickLength=0)
        left.setLabel("steps")
        self.steps_plot.getAxis("bottom").enableAutoSIPrefix(False)
        left.setToolTip(
            "A tick per training step (optimizer step, or backward when the "
            "script updates parameters by hand)"
        )
        self.steps_plot.vb.sigRangeChangedManually.connect(self._user_moved)
        self.step_ticks = self.steps_plot.plot(
            [], [], connect="pairs", pen=pg.mkPen("#888", width=1)
        )
        self.steps_label = pg.TextItem(anchor=(0, 0))
        self.steps_plot.addItem(self.steps_label, ignoreBounds=True)
        for plot in (self.plots["accelerator"], self.steps_plot):
            plot.setXLink(self.plots["host"])
        #: Epoch and user markers, and where alerts were raised, as lines across the plots.
        self.marks = MarkerLines(session, [*self.plots.values(), self.steps_plot])
        # Every plot's x is linked to this one: a zoom, a scroll or following the run.
        self.steps_plot.vb.sigXRangeChanged.connect(self.marks.thin_labels)
        self._crosshairs = []
        for plot in (*self.plots.values(), self.steps_plot):
            line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#999", style=Qt.DotLine))
            line.setVisible(False)
            plot.addItem(line, ignoreBounds=True)
            self._crosshairs.append(line)
        # An axis replays its picture (ticks, grid lines across the plot, tick text) on
        # every paint, about 10 ms a frame of the 17 ms; cached as a pixmap, it is
        # re-rendered only when its range or style changes (AxisItem.update()). 56 -> 124
        # frames/s with 8 traces scrolling (benchmarks/gui_speed.py).
        for plot in (*self.plots.values(), self.steps_plot):
            for name in ("left", "bottom"):
                plot.getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self._mouse_proxy = pg.SignalProxy(
            self.scene().sigMouseMoved, rateLimit=30, slot=self._hover
        )
        self._update_x_label()
        self.apply_palette()

    # -- appearance -----------------------------------------------------------------------
    def apply_palette(self) -> None:
        """Match the plot background and axes to the application palette (light or dark)."""
        follow_palette(self)  # the background, every axis and its ticks, the legend
        text = self.palette().color(QPalette.Text)
        for plot in (*self.plots.values(), self.steps_plot):
            plot.titleLabel.setText(plot.titleLabel.text, color=text.name())
        self.readout.setText(self.readout.text, color=text.name())
        self.steps_label.setColor(text)

    def _update_x_label(self) -> None:
        label = "time (s)" if self.x_mode == "time" else "step"
        self.plots["host"].setLabel("bottom", "")
        self.steps_plot.setLabel("bottom", label)
        self.plots["host"].hideAxis("bottom")
        self.plots["accelerator"].hideAxis("bottom")

    # -- settings -------------------------------------------------------------------------
    @Slot(str)
    def set_x_mode(self, mode: str) -> None:
        """``"time"`` (seconds since start) or ``"steps"``."""
        if mode not in ("time", "steps"):
            raise ValueError(mode)
        self.x_mode = mode
        self._update_x_label()
        self.clear_readout()  # its x was in the other unit ("t = ..." in step mode)
        self.marks.place(mode)
        self.refresh(force=True)

    @Slot(str)
    def set_unit(self, unit: str) -> None:
        """``"auto"`` or one of B, KiB, MiB, GiB."""
        if unit != "auto" and unit not in UNITS:
            raise ValueError(unit)
        self.unit = unit
        self.refresh(force=True)

    @Slot(bool)
    def set_follow(self, follow: bool) -> None:
        """Keep the newest data in view (the window set by ``window_s``)."""
        self.follow = follow
        self.refresh(force=True)

    def set_window(self, seconds: float | None) -> None:
        """Width of the followed window in seconds; ``None`` shows the whole run."""
        self.window_s = seconds
        self.refresh(force=True)

    @Slot(bool)
    def set_paused(self, paused: bool) -> None:
        """Freeze the picture (data keeps being recorded) or resume."""
        self.paused = paused
        if not paused:
            self.refresh(force=True)

    @Slot(object)
    def set_scope(self, scope: str | None) -> None:
        """Show only the series of one rank (or the total); ``None`` shows every rank."""
        self.scope = scope
        for key, curve in self._curves.items():
            curve.setVisible(self._shown(self.session.name(key)))
        self.refresh(force=True)

    def _shown(self, name: SeriesName) -> bool:
        """Whether ``name``'s trace is drawn in the chosen scope: a job's when its
        process and its metric are switched on in the legend, a run's when its metric is
        not one of those hidden until asked for."""
        if not name.shown_in(self.scope):
            return False
        return self.job_legend.shows(name) if name.scope else name.metric not in HIDDEN_BY_DEFAULT

    def _apply_job_legend(self) -> None:
        """A process or a metric was switched in the legend: show or hide its traces."""
        for key, curve in self._curves.items():
            name = self.session.name(key)
            if name.scope:
                curve.setVisible(self._shown(name))
        self.refresh(force=True)  # the unit follows what is shown

    def curve_keys(self) -> list[str]:
        """Series that have a curve."""
        return list(self._curves)

    def visible_keys(self) -> list[str]:
        """Series whose curve is shown."""
        return [k for k, c in self._curves.items() if c.isVisible()]

    # -- drawing --------------------------------------------------------------------------
    def clear_data(self) -> None:
        """Drop curves and markers (a new run)."""
        for key, curve in self._curves.items():
            for sample, label in list(self.legend.items):
                if sample.item is curve:
                    self.legend.removeItem(curve)
                    sample.deleteLater()
                    label.deleteLater()
            self.plots[plot_group(self.session.name(key))].removeItem(curve)
            curve.deleteLater()
        self.job_legend.clear()
        self._curves.clear()
        self._xy.clear()
        self._drawn.clear()
        self.clear_readout()  # it read the last run (an attach showed its "t = 22.3 s")
        self.marks.clear()
        self.step_ticks.setData([], [])
        self.samples_drawn = 0
        self.plots["accelerator"].setVisible(False)
        self.follow = True
        self.follow_changed.emit(True)

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        """Re-flow the legend to the new width."""
        super().resizeEvent(event)
        # pyqtgraph resizes once while the view is built (no legend yet) and once as it
        # closes, after its scene cleared the legend's items.
        if hasattr(self, "legend") and not getattr(self, "closed", False):
            self._fit_legend()

    def _fit_legend(self) -> None:
        """As many legend columns as the width holds, and the legend's row as tall as its
        rows: a legend wider than the view would widen the plots past the window's edge."""
        items = self.legend.items
        if not items:
            return
        # The text's own width: a label's box is stretched to its column's.
        widest = max(s.boundingRect().width() + lb.item.boundingRect().width() for s, lb in items)
        room = max(self.width() - 40, 1)
        columns = max(1, min(len(items), LEGEND_COLUMNS, int(room // (widest + 18))))
        if columns != self.legend.columnCount:
            self.legend.setColumnCount(columns)
        rows = -(-len(items) // columns)
        self.ci.layout.setRowMaximumHeight(0, 8 + 22 * rows)

    def _curve(self, key: str) -> pg.PlotDataItem:
        curve = self._curves.get(key)
        if curve is None:
            name = self.session.name(key)
            metric, label = name.metric, name.label
            plot = self.plots[plot_group(name)]
            curve = plot.plot(
                [], [], name=label, skipFiniteCheck=True, **curve_style(name, series_color(name))
            )
            if name.scope:
                self.job_legend.add(name)
            else:
                self.legend.addItem(curve, label)
            self._fit_legend()
            curve.setToolTip(METRICS[metric].tooltip if metric in METRICS else key)
            curve.setVisible(self._shown(name))
            plot.setVisible(True)
            self._curves[key] = curve
        return curve

    @staticmethod
    def _set_width(curve: pg.PlotDataItem, width: float) -> None:
        pen = curve.opts.get("pen")
        if pen is None or not isinstance(pen, QPen) or pen.widthF() == width:
            return  # dots (sparse metrics), or already so
        pen = QPen(pen)
        pen.setWidthF(width)
        curve.setPen(pen)

    def _x(self, t: np.ndarray) -> np.ndarray:
        return t if self.x_mode == "time" else self.session.to_steps(t)

    @Slot()
    def bind(self, bridge: SessionBridge) -> None:
        """Redraw at the bridge's rate (at most ~30 times a second)."""
        bridge.changed.connect(self.refresh)

    def bind_view_state(self, state: ViewState) -> None:
        """Draw what the window's view state says; a pan or zoom turns its Follow off."""
        state.scope_changed.connect(self.set_scope)
        state.x_mode_changed.connect(self.set_x_mode)
        state.unit_changed.connect(self.set_unit)
        state.window_changed.connect(self._on_window_chosen)
        state.follow_changed.connect(self.set_follow)
        state.paused_changed.connect(self.set_paused)
        self.follow_changed.connect(state.set_follow)
        self.scope, self.x_mode, self.unit = state.scope, state.x_mode, state.unit
        self.window_s, self.follow, self.paused = state.window_s, state.follow, state.paused
        self._update_x_label()
        self.refresh(force=True)

    @Slot(str)
    def _on_window_chosen(self, label: str) -> None:
        self.set_window(dict(WINDOWS)[label])

    def refresh(self, force: bool = False) -> None:
        """Pull the Session's data into the curves (no-op while paused)."""
        if self.paused and not force:
            return
        # Counts (allocation retries, OOMs) are no bytes: the readings table shows them.
        every = self.session.keys()
        keys = [k for k in every if not self.session.name(k).is_count]
        data = {k: self.session.arrays(k) for k in keys}
        for group, plot in self.plots.items():
            group_keys = [k for k in keys if plot_group(self.session.name(k)) == group]
            if not group_keys:
                continue
            unit = self._pick_unit(data, group_keys)
            scale = 1.0 / UNITS[unit]
            (x0, x1), _ = plot.vb.viewRange()
            for key in group_keys:
                t, v = data[key]
                x = self._x(t)
                self._xy[key] = (x, v)
                curve = self._curve(key)
                # Unchanged data is not set again: a reopened recording refreshes several
                # times, and dots (USS) cost 13 ms a series to set (ScatterPlotItem).
                drawn = (len(x), x[0], x[-1], v[0], v[-1], scale) if len(x) else (0, scale)
                if self._drawn.get(key) != drawn:
                    self._drawn[key] = drawn
                    curve.setData(x, v * scale)
                shown = int(np.searchsorted(x, x1) - np.searchsorted(x, x0))
                self._set_width(curve, 1.0 if shown > DENSE_POINTS else 2.0)
            if self._shown_units.get(group) != unit:
                self._shown_units[group] = unit
                plot.setLabel("left", f"memory ({unit})")
        self.samples_drawn = self.session.samples
        self._draw_steps()
        self.marks.draw(self.x_mode)
        if self.follow:
            self._follow(data)

    def _pick_unit(self, data: dict, keys: list[str]) -> str:
        if self.unit != "auto":
            return self.unit
        peak = 0.0
        for key in keys:
            curve = self._curves.get(key)
            if curve is not None and not curve.isVisible():
                continue
            v = data[key][1]
            if len(v):
                peak = max(peak, float(np.nanmax(v)))
        return auto_unit(peak) if peak else "MiB"

    def _draw_steps(self) -> None:
        times, steps = self.session.steps.boundaries()
        total = self.session.steps.steps
        if len(times) > MAX_STEP_TICKS:
            every = int(np.ceil(len(times) / MAX_STEP_TICKS))
            times, steps = times[::every], steps[::every]
        x = times if self.x_mode == "time" else steps
        self.step_ticks.setData(np.repeat(x, 2), np.tile([0.0, 0.6], len(x)))
        self.steps_label.setText(f"{total:,} steps" if total else "no steps yet")
        (x0, _), _ = self.steps_plot.vb.viewRange()
        self.steps_label.setPos(x0, 1.0)

    def _follow(self, data: dict) -> None:
        t_max = max((float(t[-1]) for t, _ in data.values() if len(t)), default=0.0)
        if t_max <= 0:
            return
        t_min = 0.0 if self.window_s is None else max(0.0, t_max - self.window_s)
        x0, x1 = self._x(np.array([t_min, t_max]))
        if x1 <= x0:
            x1 = x0 + 1
        self._setting_range = True
        try:
            self.plots["host"].setXRange(float(x0), float(x1), padding=0.01)
            for plot in self.plots.values():
                plot.enableAutoRange(axis="y")
                plot.setAutoVisible(y=True)
        finally:
            self._setting_range = False

    @Slot()
    def _user_moved(self, *_: object) -> None:
        if not self._setting_range and self.follow:
            self.follow = False
            self.follow_changed.emit(False)

    # -- hover readout --------------------------------------------------------------------
    def value_at(self, key: str, x: float) -> float | None:
        """Value of a series at the sample nearest to ``x`` (in current X units)."""
        found = self._nearest(key, x)
        return found[1] if found is not None else None

    def _nearest(self, key: str, x: float) -> tuple[float, float] | None:
        """(x, value) of a series' sample nearest to ``x``; for a series read less often
        (drawn as held steps), the reading held at ``x``: the last one at or before it.
        None for an empty series."""
        xs, vs = self._xy.get(key, (np.empty(0), np.empty(0)))
        if not len(xs):
            return None
        if self.session.name(key).sparse:
            i = max(int(np.searchsorted(xs, x, side="right")) - 1, 0)
            return float(xs[i]), float(vs[i])
        i = int(np.clip(np.searchsorted(xs, x), 0, len(xs) - 1))
        if i > 0 and abs(xs[i - 1] - x) < abs(xs[i] - x):
            i -= 1
        return float(xs[i]), float(vs[i])

    def _hover(self, event: tuple[QPointF]) -> None:
        pos = event[0]
        plot = next(
            (
                p
                for p in (*self.plots.values(), self.steps_plot)
                if p.isVisible() and p.sceneBoundingRect().contains(pos)
            ),
            None,
        )
        if plot is None:
            for line in self._crosshairs:
                line.setVisible(False)
            return
        x = plot.vb.mapSceneToView(pos).x()
        self.show_readout(x)

    def show_readout(self, x: float) -> str:
        """Put the crosshair at ``x`` and list every visible series' value there.

        Values are those of one moment: the sample of the densest series nearest to
        ``x``. A series read less often (USS, every 2 s) whose nearest reading is of
        another moment says when it was read, so that an RSS is never shown beside a
        USS of another time as if they belonged together."""
        for line in self._crosshairs:
            line.setValue(x)
            line.setVisible(True)
        shown = [(k, c) for k, c in self._curves.items() if c.isVisible()]
        densest = max(shown, key=lambda kc: len(self._xy.get(kc[0], ((),))[0]), default=None)
        moment = self._nearest(densest[0], x) if densest is not None else None
        at = moment[0] if moment is not None else x
        head = f"t = {at:,.1f} s" if self.x_mode == "time" else f"step {at:,.1f}"
        parts = [f"<b>{head}</b>"]
        for key, _ in shown:
            found = self._nearest(key, at)
            if found is None:
                continue
            when, value = found
            name = self.session.name(key)
            color = series_color(name).name()
            part = f"<span style='color:{color}'>{name.label}</span> {format_bytes(value)}"
            if abs(when - at) > 1e-9:
                part += f" <i>({self._moment_text(when, at)})</i>"
            parts.append(part)
        text = " &nbsp;·&nbsp; ".join(parts)
        self.readout.setText(text, color=self.palette().color(QPalette.Text).name())
        return text

    def _moment_text(self, when: float, at: float) -> str:
        """When a reading of another moment was taken: ``read 1.8 s before``, ``at step 12``."""
        if self.x_mode != "time":
            return f"at step {when:,.1f}"
        gap = at - when
        return f"read {abs(gap):,.1f} s {'before' if gap > 0 else 'after'}"

    def clear_readout(self) -> None:
        """Hide the crosshair and empty the readout: what it said belongs to other data."""
        for line in self._crosshairs:
            line.setVisible(False)
        self.readout.setText("")
