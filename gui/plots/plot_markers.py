"""Lines across the trace plots: epoch and user markers, and where each alert was raised.

A marker or an alert is one vertical line on each plot (labelled on the host plot),
placed by time or by step as the plot's x axis is. Only the newest
:data:`MAX_MARKER_LINES` markers keep their lines (thousands would slow every frame), and
a label is shown only where it has room.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import Qt

from torchmem.events import Alert, Marker, MarkerKind, Severity
from torchmem.session import Session

MARKER_COLORS = {MarkerKind.EPOCH: "#e377c2", MarkerKind.USER: "#bcbd22"}
#: Marker lines kept on the plots (the newest): thousands of lines would cost every frame.
MAX_MARKER_LINES = 120
#: Above the traces (pyqtgraph draws them at 0, the later over the earlier): a trace
#: drawn across "epoch 2" hid the 2.
LABEL_Z = 10
#: Space kept between two marker labels (px).
MARKER_LABEL_GAP_PX = 12
#: The plot (of those given) whose lines carry the labels: the host plot.
LABELLED = 1


def discard(item: pg.GraphicsObject) -> None:
    """Take an item off its plot and have Qt delete it here, in the GUI thread.

    A removed pyqtgraph item is often in a reference cycle. Left to Python's gc it could be
    destroyed by a collection in another thread (the script's, the command thread's
    gc.collect()), and destroying a Qt object there deadlocks PySide6.
    """
    view = item.getViewBox()
    if view is not None:
        # Off the PlotItem when it has one: its list of items keeps a reference that the
        # view's removeItem leaves, and every marker line dropped stayed alive with it.
        owner = view.parentItem()
        if isinstance(owner, pg.PlotItem):
            owner.removeItem(item)
        else:
            view.removeItem(item)
    item.deleteLater()


class MarkerLines:
    """The Session's markers and raised alerts as lines across ``plots``."""

    def __init__(self, session: Session, plots: Sequence[pg.PlotItem]) -> None:
        self.session = session
        self.plots = list(plots)
        self.x_mode = "time"
        #: The markers drawn, oldest first, each with its line on every plot.
        self.markers: list[tuple[Marker, list[pg.InfiniteLine]]] = []
        #: The alerts drawn, by alert key.
        self.alerts: dict[str, tuple[Alert, list[pg.InfiniteLine]]] = {}

    def draw(self, x_mode: str) -> None:
        """Add lines for the markers and alerts the Session has that are not drawn yet."""
        self.x_mode = x_mode
        self._draw_markers()
        self._draw_alerts()

    def place(self, x_mode: str) -> None:
        """Move every line to its time or step (``x_mode``, the plot's new x axis)."""
        self.x_mode = x_mode
        for marker, lines in self.markers:
            self._place(lines, marker.t, marker.step)
        for alert, lines in self.alerts.values():
            self._place(lines, alert.t, alert.raised_step)

    def clear(self) -> None:
        """Remove every line (a new run)."""
        for _, lines in [*self.markers, *self.alerts.values()]:
            for line in lines:
                discard(line)
        self.markers.clear()
        self.alerts.clear()

    def _place(self, lines: list[pg.InfiniteLine], t: float, step: int | None) -> None:
        pos = t if self.x_mode == "time" else float(step or 0)
        for line in lines:
            line.setValue(pos)

    def _lines(
        self, color: str, width: float, style: Qt.PenStyle, label: str, position: float,
        tooltip: str,
    ) -> list[pg.InfiniteLine]:  # fmt: skip
        lines = []
        for i, plot in enumerate(self.plots):
            line = pg.InfiniteLine(
                angle=90,
                movable=False,
                pen=pg.mkPen(color, width=width, style=style),
                label=label if i == LABELLED else None,
                labelOpts={"position": position, "color": color, "movable": False},
            )
            line.setToolTip(tooltip)
            if i == LABELLED:
                line.setZValue(LABEL_Z)
            plot.addItem(line, ignoreBounds=True)
            lines.append(line)
        return lines

    def _draw_markers(self) -> None:
        markers = self.session.user_markers()
        last = self.markers[-1][0] if self.markers else None
        start = 0
        if last is not None:  # markers after the last one drawn (the deque may have rolled)
            start = next((i + 1 for i in range(len(markers) - 1, -1, -1) if markers[i] is last), 0)
        for marker in markers[start:][-MAX_MARKER_LINES:]:
            lines = self._lines(
                MARKER_COLORS.get(marker.kind, "#bcbd22"), 1.5, Qt.DashLine, marker.label,
                0.92, f"{marker.label} (step {marker.step}, {marker.t:.1f} s)",
            )  # fmt: skip
            self.markers.append((marker, lines))
            self._place(lines, marker.t, marker.step)
        while len(self.markers) > MAX_MARKER_LINES:
            _, old_lines = self.markers.pop(0)
            for line in old_lines:
                discard(line)
        if start < len(markers):
            self.thin_labels()

    def thin_labels(self, *_: object) -> None:
        """Label a marker only where its label has room: a script that marks every few
        steps drew its labels over each other into one unreadable smear. The newest
        labels win; a marker without its label keeps its line and tooltip, and zooming
        in brings the label back."""
        shown_left: float | None = None  # the left end of the last label shown
        view = None
        for _, lines in reversed(self.markers):
            line = next((ln for ln in lines if getattr(ln, "label", None)), None)
            if line is None:
                continue
            if view is None:  # every labelled line is on one plot: its range, once
                vb = line.getViewBox()
                if vb is None or vb.width() <= 0:
                    return
                (x0, x1), _ = vb.viewRange()
                if x1 <= x0:
                    return
                view = (x0, vb.width() / (x1 - x0), vb.width())
            x0, scale, width = view
            px = (line.value() - x0) * scale
            if px < 0:
                break  # this one and every older one are left of the view
            if px > width:
                continue
            # pyqtgraph puts a label right of its line in the view's left half and left
            # of it in the right half (so that the newest stays inside the plot).
            w = line.label.boundingRect().width() + MARKER_LABEL_GAP_PX
            left, right = (px, px + w) if px < width / 2 else (px - w, px)
            room = shown_left is None or right <= shown_left
            if line.label.isVisible() != room:
                line.label.setVisible(room)
            if room:
                shown_left = left

    def _draw_alerts(self) -> None:
        """A line where each alert was first raised (once per alert key)."""
        for alert in self.session.raised_alerts():
            if alert.session_key in self.alerts:
                continue
            color = "#d62728" if alert.severity is Severity.CRITICAL else "#ff7f0e"
            lines = self._lines(
                color, 2, Qt.DotLine, f"⚠ {alert.kind.replace('_', ' ')}", 0.8,
                f"{alert.said}\n\nFix: {alert.suggestion}",
            )  # fmt: skip
            self.alerts[alert.session_key] = (alert, lines)
            self._place(lines, alert.t, alert.raised_step)
