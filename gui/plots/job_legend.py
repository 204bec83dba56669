"""The trace legend of a job: one entry per process and one per metric, not one per trace.

With an entry per trace, a 3-rank job's legend held 16 entries (each rank's RSS, USS,
system available, C heap free and peak RSS, and the total's) two columns deep, and left
the Host memory plot about 100 px of a default window; 8 ranks would have made 41. Here
each process (its colour) and each metric (its line style) has one entry: 9 at 3 ranks,
14 at 8. A click on a process hides or shows all its traces, a click on a metric hides or
shows it in every process; a trace is drawn when both its process and its metric are on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyqtgraph as pg
from PySide6.QtGui import QColor

from torchmem.gui.plots.series_style import HIDDEN_BY_DEFAULT, curve_style, job_shade, series_color
from torchmem.series import METRICS, SeriesName, scope_label, scope_order

#: The shade a metric's entry is drawn in: every process draws it in its own colour.
METRIC_SAMPLE_COLOR = "#7f7f7f"


class JobLegend:
    """The process and metric entries of a job's traces in ``legend``; ``on_change`` is
    called when the user switches one (the plot then shows or hides its traces)."""

    def __init__(self, legend: pg.LegendItem, on_change: Callable[[], None]) -> None:
        self.legend = legend
        self.on_change = on_change
        #: Each entry's stand-in item (never drawn): its visibility is the switch.
        self.processes: dict[str, pg.PlotDataItem] = {}
        self.metrics: dict[str, pg.PlotDataItem] = {}

    def add(self, name: SeriesName) -> None:
        """Give ``name``'s process and metric an entry each, if they have none yet."""
        added = False
        if name.scope not in self.processes:
            pen = pg.mkPen(series_color(SeriesName(name.scope, "cpu", "rss")), width=4)
            self.processes[name.scope] = self._stand_in(pen=pen)
            added = True
        if name.metric not in self.metrics:
            self.metrics[name.metric] = self._metric_stand_in(name)
            added = True
        if added:
            self._relist()

    def shows(self, name: SeriesName) -> bool:
        """True when both the process and the metric of ``name`` are switched on."""
        process, metric = self.processes.get(name.scope), self.metrics.get(name.metric)
        return (process is None or process.isVisible()) and (metric is None or metric.isVisible())

    def clear(self) -> None:
        """Remove every entry (a new run)."""
        for item in (*self.processes.values(), *self.metrics.values()):
            self.legend.removeItem(item)
            item.deleteLater()
        self.processes.clear()
        self.metrics.clear()

    # -- entries ----------------------------------------------------------------------------
    def _stand_in(self, **style: Any) -> pg.PlotDataItem:
        item = pg.PlotDataItem([0.0], [0.0], **style)  # a point: the sample draws its symbol
        item.visibleChanged.connect(self.on_change)
        return item

    def _metric_stand_in(self, name: SeriesName) -> pg.PlotDataItem:
        """An entry drawn as the metric's traces are (dashes, dots, a lighter shade), in
        grey: each process draws it in its own colour."""
        grey = job_shade(QColor(METRIC_SAMPLE_COLOR), name.metric)
        item = self._stand_in(**curve_style(name, grey))
        if name.metric in HIDDEN_BY_DEFAULT:
            item.blockSignals(True)  # off from the start: nothing to redraw yet
            item.setVisible(False)
            item.blockSignals(False)
        return item

    def _relist(self) -> None:
        """Every entry again, processes first (ranks in order, the total last), then the
        metrics in METRICS' order: entries arrive as their traces do, interleaved (a
        relisted item gets a new sample and label; the stand-ins, and so the switches,
        stay)."""
        for item in (*self.processes.values(), *self.metrics.values()):
            self.legend.removeItem(item)
        order = {metric: i for i, metric in enumerate(METRICS)}
        for scope in sorted(self.processes, key=scope_order):
            self._list(self.processes[scope], scope_label(scope),
                       f"{scope_label(scope)}: click to hide or show all its traces")  # fmt: skip
        for metric in sorted(self.metrics, key=lambda m: (order.get(m, len(order)), m)):
            info = METRICS.get(metric)
            tip = f"{info.tooltip}\n\n" if info else ""
            self._list(self.metrics[metric], info.label if info else metric,
                       f"{tip}Click to hide or show it in every process")  # fmt: skip

    def _list(self, item: pg.PlotDataItem, label: str, tooltip: str) -> None:
        self.legend.addItem(item, label)
        sample, text = self.legend.items[-1]
        sample.setToolTip(tooltip)
        text.setToolTip(tooltip)
