"""How a series is drawn, wherever it is: its colour (by metric in a run, by process in a
job), its line (dashed for a limit or a peak) or its dots (a metric read every few
seconds), and which metrics wait to be asked for. The traces and the legend of a job's
metrics draw from here, so that an entry always looks like its traces.
"""

from __future__ import annotations

from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from torchmem.series import SeriesName

COLORS = {
    "allocated": "#1f77b4",
    "reserved": "#ff7f0e",
    "peak_allocated": "#d62728",
    "nvml_used": "#9467bd",
    "rss": "#2ca02c",
    "uss": "#17becf",
    "available": "#8c8c8c",
    "heap_free": "#8c564b",
    "children": "#bc5090",
}
DASHED = {"peak_allocated", "available", "heap_free"}
HIDDEN_BY_DEFAULT = {"available", "heap_free", "rss_peak"}
#: In a job, where a process has one colour, these metrics are drawn in a lighter shade of
#: it (a cache beside what it holds: reserved beside allocated, USS beside RSS).
LIGHTER = {"reserved", "uss", "nvml_used"}

#: One colour per rank of a job (metrics of a rank differ by line style and shade).
RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#17becf")  # fmt: skip
#: Processes of a job without a rank (an mp.spawn script's own process, a spawned helper):
#: colours no rank has, so that ``pid 4242`` never looks like ``rank 2``.
PROCESS_COLORS = ("#bcbd22", "#7b4173", "#637939", "#843c39", "#393b79", "#8c6d31")
TOTAL_COLOR = "#404040"


def series_color(name: SeriesName) -> QColor:
    """A stable colour per metric (per rank in a job); further devices of one kind get
    darker shades."""
    if name.is_total:
        color = QColor(TOTAL_COLOR)
    elif name.is_node:  # a machine's total: a grey of its own, lighter than the job's
        color = QColor(TOTAL_COLOR).lighter(150 + 40 * (sum(map(ord, name.scope)) % 4))
    elif name.scope:
        palette = RANK_COLORS if name.is_rank else PROCESS_COLORS
        color = job_shade(QColor(palette[name.index % len(palette)]), name.metric)
    else:
        color = QColor(COLORS.get(name.metric, "#7f7f7f"))
    number = name.device.rpartition(":")[2]
    index = int(number) if number.isdigit() else 0
    return color.darker(100 + 35 * index) if index and not name.scope else color


def job_shade(color: QColor, metric: str) -> QColor:
    """``color`` as a job draws ``metric`` in it: lighter for the metrics in LIGHTER."""
    return color.lighter(140) if metric in LIGHTER else color


def curve_style(name: SeriesName, color: QColor) -> dict[str, Any]:
    """The keyword arguments of ``PlotDataItem`` that draw ``name``'s metric in ``color``."""
    if name.sparse:
        # Read every few seconds (USS): a dot per reading. A line between readings would
        # invent the values in between (a ramp down from a burst long gone).
        return {"pen": None, "symbol": "o", "symbolSize": 5, "symbolPen": None,
                "symbolBrush": color}  # fmt: skip
    pen = pg.mkPen(color, width=2)
    if name.metric in DASHED:
        pen.setStyle(Qt.DashLine)
    return {"pen": pen}
