"""Where the tensor bytes go, by kind, across the censuses taken so far (stacked areas).

A census is a snapshot: its figures hold from its step until the next census (the areas
are drawn as steps, not interpolated), and the newest one holds up to the run's latest
step. The legend sits above the plot, as a line of swatches with the newest census's
bytes per kind, so it never covers the areas of a small dock.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from torchmem.events import CensusTaken
from torchmem.gui.bridge import SessionBridge
from torchmem.gui.view_state import ViewState
from torchmem.series import ProcessDevice
from torchmem.session import Session
from torchmem.tensors.model import KIND_LABELS, KINDS
from torchmem.units import UNITS, auto_unit, format_bytes

KIND_COLORS = {
    "parameter": "#1f77b4",
    "buffer": "#8c564b",
    "gradient": "#2ca02c",
    "optimizer_state": "#ff7f0e",
    "activation": "#d62728",
    "plain": "#7f7f7f",
}


#: The chart's least height in pixels: a step axis and four gridlines stay readable.
PLOT_MIN_HEIGHT = 120

#: Redraw for a newer step (the newest census's area grows) every this many steps.
STEP_REDRAW = 10


class BreakdownPlot(QWidget):
    """Stacked areas of unique tensor bytes per kind, one point per census."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        #: The process of a job chosen in the toolbar (``rank1``): its devices come first.
        self.scope: str | None = None
        self.device_combo = QComboBox()
        self.device_combo.setToolTip("Device whose tensors are shown")
        self.device_combo.currentTextChanged.connect(lambda _: self.refresh(force=True))
        self.plot = pg.PlotWidget()
        self.plot.showGrid(y=True, alpha=0.25)
        self.plot.setLabel("bottom", "step")
        self.plot.setMouseEnabled(y=False)
        # The dock shares its column with the Readings: without a floor, the window's
        # default size left the chart a sliver under its legend.
        self.plot.setMinimumHeight(PLOT_MIN_HEIGHT)
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.RichText)
        self.legend.setToolTip(
            "Unique tensor bytes by kind at the newest census (views counted once); the "
            "areas stack them from census to census.<br>Kinds: "
            + ", ".join(KIND_LABELS[kind] for kind in KINDS)
        )
        self.empty = QLabel("Tensor bytes by kind appear here after the first census.")
        self.empty.setWordWrap(True)
        self._curves: list[pg.PlotDataItem] = []
        self._fills: list[pg.FillBetweenItem] = []
        # An invisible floor (a pen of no colour: with pen=None it draws no path to fill to).
        base = self.plot.plot([], [], pen=pg.mkPen(0, 0, 0, 0))
        previous = base
        for kind in KINDS:
            color = QColor(KIND_COLORS[kind])
            curve = self.plot.plot([], [], pen=pg.mkPen(color, width=1))
            fill_color = QColor(color)
            fill_color.setAlpha(150)
            fill = pg.FillBetweenItem(previous, curve, brush=pg.mkBrush(fill_color))
            self.plot.addItem(fill)
            self._curves.append(curve)
            self._fills.append(fill)
            previous = curve
        self._base = base
        self._count = -1
        self._last_step = 0
        top = QHBoxLayout()
        top.addWidget(QLabel("Device:"))
        top.addWidget(self.device_combo, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(top)
        layout.addWidget(self.legend)
        layout.addWidget(self.empty)
        layout.addWidget(self.plot, 1)
        self.plot.setVisible(False)  # until the first census
        self.apply_palette()

    def apply_palette(self) -> None:
        """Follow the application palette (light or dark)."""
        self.plot.setBackground(self.palette().color(QPalette.Base))

    def bind_view_state(self, state: ViewState) -> None:
        """Show a device of the process the window's view state chose."""
        state.scope_changed.connect(self.set_scope)
        if state.scope is not None:
            self.set_scope(state.scope)

    @Slot(object)
    def set_scope(self, scope: str | None) -> None:
        """Follow the toolbar's rank filter: show a device of that rank (``rank1/cpu``)."""
        self.scope = scope
        self.refresh(force=True)
        self._pick_scope_device()

    def _pick_scope_device(self) -> None:
        if not self.scope:
            return
        if self.device is not None and self.device.scope == self.scope:
            return
        for i in range(self.device_combo.count()):
            if self.device_combo.itemData(i).scope == self.scope:
                self.device_combo.setCurrentIndex(i)  # redraws through currentTextChanged
                return

    @property
    def device(self) -> ProcessDevice | None:
        """The device shown and its process (``("rank1", "cuda:0")``); None before the
        first census."""
        return self.device_combo.currentData()

    @Slot()
    def bind(self, bridge: SessionBridge) -> None:
        """Redraw for each census, and every few steps while shown (the step axis grows)."""
        bridge.when((CensusTaken,), self.refresh)
        bridge.changed.connect(self._on_changed)

    @Slot()
    def _on_changed(self) -> None:
        if self.isVisible():
            self.refresh()  # redraws only for a new census or 10 more steps

    def refresh(self, force: bool = False) -> None:
        """Redraw from the Session's census history when it changed."""
        history = self.session.breakdown()
        moved = self.session.steps.steps - self._last_step >= STEP_REDRAW
        if len(history) == self._count and not force and not (history and moved):
            return
        self._count = len(history)
        self._last_step = self.session.steps.steps
        self.empty.setVisible(not history)
        self.legend.setVisible(bool(history))
        self.plot.setVisible(bool(history))
        devices = sorted({d for _, _, by in history for d in by}, key=ProcessDevice.order)
        current = self.device
        if devices != [self.device_combo.itemData(i) for i in range(self.device_combo.count())]:
            self.device_combo.blockSignals(True)
            self.device_combo.clear()
            for name in devices:
                self.device_combo.addItem(name.label, name)
            if current in devices:
                self.device_combo.setCurrentIndex(devices.index(current))
            self.device_combo.blockSignals(False)
            before = self.device
            self._pick_scope_device()  # the chosen rank's first census may just have come
            if self.device != before:
                return  # redrawn by the change of device
        device = self.device
        # Attached to a job, the censuses of every process come in turn: a rank's chart
        # steps from its own censuses, not down to nothing at each census of another one.
        history = [entry for entry in history if device in entry[2]]
        if not history or device is None:
            for curve in (self._base, *self._curves):
                curve.setData([], [])
            return
        steps = np.array([step for _, step, _ in history], dtype=float)
        values = np.array(
            [[by.get(device, {}).get(k, 0) for k in KINDS] for _, _, by in history], dtype=float
        )
        unit = auto_unit(float(values.sum(axis=1).max()) or 1.0)
        stacked = np.cumsum(values, axis=1) / UNITS[unit]
        # Each census holds until the next one; the newest up to the latest step.
        ends = np.append(steps[1:], max(steps[-1] + 1, self._last_step))
        x = np.column_stack([steps, ends]).ravel()
        self._base.setData(x, np.zeros_like(x))
        for i, curve in enumerate(self._curves):
            curve.setData(x, np.repeat(stacked[:, i], 2))
        self.plot.setLabel("left", unit)
        self.legend.setText(_legend_html(values[-1], device))

    def stacked_totals(self) -> list[float]:
        """Top of the stack at each census (in the shown unit), for tests."""
        _, y = self._curves[-1].getData()
        return [] if y is None else [float(v) for v in y[::2]]


def _legend_html(newest: np.ndarray, device: ProcessDevice) -> str:
    """Swatches with the newest census's bytes per kind, kinds that hold nothing left out,
    two to a line: one to a line, six kinds left the chart no room in a small window."""
    # A long label may wrap inside its cell; its last word and its figure never break
    # apart ("278.1" on one line, "KiB" on the next).
    cells = [
        f'<td><span style="color:{KIND_COLORS[kind]}">■</span>&nbsp;{_short(kind)}&nbsp;'
        + f"<b>{format_bytes(float(nbytes))}</b>".replace(" ", "&nbsp;")
        + "</td>"
        for kind, nbytes in zip(KINDS, newest, strict=True)
        if nbytes > 0
    ]
    rows = "".join(
        "<tr>" + '<td width="10"></td>'.join(cells[i : i + 2]) + "</tr>"
        for i in range(0, len(cells), 2)
    )
    total = format_bytes(float(newest.sum())).replace(" ", "&nbsp;")
    return f"{device.label}: <b>{total}</b><table cellspacing=0 cellpadding=0>{rows}</table>"


def _short(kind: str) -> str:
    """A kind's label in the legend: "activations" for "activations / saved for backward"
    (the legend's tooltip gives each whole)."""
    return KIND_LABELS[kind].split(" / ")[0]
