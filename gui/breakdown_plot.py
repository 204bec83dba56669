"""Where the tensor bytes go, by kind, across the censuses taken so far (stacked areas)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Slot
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from torchmem.session import Session
from torchmem.tensor_census import KIND_LABELS, KINDS
from torchmem.units import UNITS, auto_unit

KIND_COLORS = {
    "parameter": "#1f77b4",
    "buffer": "#8c564b",
    "gradient": "#2ca02c",
    "optimizer_state": "#ff7f0e",
    "activation": "#d62728",
    "plain": "#7f7f7f",
}


class BreakdownPlot(QWidget):
    """Stacked areas of unique tensor bytes per kind, one point per census."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.device_combo = QComboBox()
        self.device_combo.setToolTip("Device whose tensors are shown")
        self.device_combo.currentTextChanged.connect(lambda _: self.refresh(force=True))
        self.plot = pg.PlotWidget()
        self.plot.showGrid(y=True, alpha=0.25)
        self.plot.setLabel("bottom", "step")
        self.plot.setMouseEnabled(y=False)
        self.legend = self.plot.addLegend(offset=(5, 5), labelTextSize="8pt")
        self.empty = QLabel("Tensor bytes by kind appear here after the first census.")
        self.empty.setWordWrap(True)
        self._curves: list[pg.PlotDataItem] = []
        self._fills: list[pg.FillBetweenItem] = []
        self._swatches: list[pg.PlotDataItem] = []
        base = self.plot.plot([], [], pen=None)
        previous = base
        for kind in KINDS:
            color = QColor(KIND_COLORS[kind])
            curve = self.plot.plot([], [], pen=pg.mkPen(color, width=1))
            fill_color = QColor(color)
            fill_color.setAlpha(150)
            fill = pg.FillBetweenItem(previous, curve, brush=pg.mkBrush(fill_color))
            self.plot.addItem(fill)
            # A stand-in that only the legend draws (a swatch of the fill colour): the legend
            # cannot draw a FillBetweenItem itself (it crashes pyqtgraph 0.14).
            swatch = pg.PlotDataItem(
                [], [], pen=pg.mkPen(color), fillLevel=0, brush=pg.mkBrush(fill_color)
            )
            self.legend.addItem(swatch, KIND_LABELS[kind])
            self._swatches.append(swatch)
            self._curves.append(curve)
            self._fills.append(fill)
            previous = curve
        self._base = base
        self._count = -1
        top = QHBoxLayout()
        top.addWidget(QLabel("Device:"))
        top.addWidget(self.device_combo, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(top)
        layout.addWidget(self.empty)
        layout.addWidget(self.plot, 1)
        self.plot.setVisible(False)  # until the first census
        self.apply_palette()

    def apply_palette(self) -> None:
        """Follow the application palette (light or dark)."""
        self.plot.setBackground(self.palette().color(QPalette.Base))

    @Slot()
    def refresh(self, force: bool = False) -> None:
        """Redraw from the Session's census history when it changed."""
        history = self.session.breakdown()
        if len(history) == self._count and not force:
            return
        self._count = len(history)
        self.empty.setVisible(not history)
        self.plot.setVisible(bool(history))
        devices = sorted({d for _, _, by in history for d in by}, key=lambda d: (d != "cpu", d))
        current = self.device_combo.currentText()
        if devices != [self.device_combo.itemText(i) for i in range(self.device_combo.count())]:
            self.device_combo.blockSignals(True)
            self.device_combo.clear()
            self.device_combo.addItems(devices)
            if current in devices:
                self.device_combo.setCurrentText(current)
            self.device_combo.blockSignals(False)
        device = self.device_combo.currentText()
        if not history or not device:
            for curve in (self._base, *self._curves):
                curve.setData([], [])
            return
        x = np.array([step for _, step, _ in history], dtype=float)
        values = np.array(
            [[by.get(device, {}).get(k, 0) for k in KINDS] for _, _, by in history], dtype=float
        )
        unit = auto_unit(float(values.sum(axis=1).max()) or 1.0)
        stacked = np.cumsum(values, axis=1) / UNITS[unit]
        self._base.setData(x, np.zeros_like(x))
        for i, curve in enumerate(self._curves):
            curve.setData(x, stacked[:, i])
        self.plot.setLabel("left", f"tensor bytes ({unit})")

    def stacked_totals(self) -> list[float]:
        """Top of the stack at each census (in the shown unit), for tests."""
        _, y = self._curves[-1].getData()
        return [] if y is None else [float(v) for v in y]
