"""The allocator's segments at one moment, drawn block by block.

Fragmentation is a picture before it is a number: a segment is a row as wide as its
size, its live allocations are coloured by kind (parameter, gradient, optimizer state,
activation) at their offsets, and the grey between them is cached but free. A row with
many small grey gaps is memory a large request cannot use. Each row is labelled with its
address and size, and its largest free piece is written beside it.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QLabel, QStackedLayout, QWidget

from torchmem.snapshots.analysis import SegmentState
from torchmem.units import format_bytes

FREE_COLOR = "#5a5a5a"
ROW_HEIGHT = 0.72
MiB = 1 << 20
#: More rows than this are drawn, but only this many are labelled on the axis.
MAX_LABELS = 60


class SegmentMap(QWidget):
    """One row per segment (by address), its blocks coloured by kind; or a message."""

    def __init__(self, colors: dict[str, str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.colors = colors
        self.plot = pg.PlotWidget()
        self.plot.setMouseEnabled(x=True, y=True)
        self.plot.setLabel("bottom", "offset in the segment (MiB)")
        self.plot.getAxis("left").setWidth(190)
        self.plot.showGrid(x=True, y=False, alpha=0.2)
        self.plot.setToolTip(
            "Each row is a segment the caching allocator holds from the device, as wide as "
            "its size. Coloured: live allocations by kind. Grey: cached but free; a request "
            "larger than a row's largest grey stretch needs a new segment (or fails)."
        )
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setMargin(12)
        self._stack = QStackedLayout(self)
        self._stack.addWidget(self.plot)
        self._stack.addWidget(self.message)
        self.rows = 0
        self.blocks = 0
        #: The text beside each row (its largest free piece), for tests and tooltips.
        self.free_labels: list[str] = []

    def show_message(self, text: str) -> None:
        """Show ``text`` instead of a map (a trace without segment events)."""
        self.message.setText(text)
        self._stack.setCurrentWidget(self.message)

    def show_segments(self, segments: list[SegmentState]) -> None:
        """Draw ``segments``: their free space, then their blocks on top."""
        self.plot.clear()
        self._stack.setCurrentWidget(self.plot)
        self.rows = len(segments)
        if not segments:
            self.show_message("No segment at this moment.")
            return
        y = np.arange(len(segments), dtype=float)
        sizes = np.array([s.size for s in segments], dtype=float) / MiB
        self.plot.addItem(
            pg.BarGraphItem(x0=0, y=y, width=sizes, height=ROW_HEIGHT, brush=FREE_COLOR, pen=None)
        )
        x0, rows, widths, brushes = [], [], [], []
        for row, seg in enumerate(segments):
            for offset, size, kind in seg.blocks:
                x0.append(offset / MiB)
                rows.append(row)
                widths.append(size / MiB)
                brushes.append(pg.mkBrush(self.colors.get(kind, self.colors.get("other"))))
        self.blocks = len(x0)
        if x0:
            self.plot.addItem(
                pg.BarGraphItem(
                    x0=np.array(x0), y=np.array(rows, dtype=float), width=np.array(widths),
                    height=ROW_HEIGHT, brushes=brushes, pen=pg.mkPen("#1e1e1e", width=0.5),
                )
            )  # fmt: skip
        every = max(1, len(segments) // MAX_LABELS)
        ticks = [
            (float(i), f"{seg.address:#x} · {format_bytes(seg.size)}")
            for i, seg in enumerate(segments)
            if i % every == 0
        ]
        self.plot.getAxis("left").setTicks([ticks, []])
        self.free_labels = []
        if len(segments) <= MAX_LABELS:  # beside each row: its largest free piece
            for i, seg in enumerate(segments):
                text = pg.TextItem(
                    f"largest free {format_bytes(seg.largest_free)}", color="#b0b0b0",
                    anchor=(0, 0.5),
                )  # fmt: skip
                text.setPos(float(sizes[i]), float(i))
                self.plot.addItem(text)
                self.free_labels.append(text.toPlainText())
        self.plot.getPlotItem().invertY(True)  # the lowest address on top, as a memory map
        self.plot.setXRange(0, float(sizes.max()) * 1.3, padding=0.02)
        self.plot.setYRange(-0.5, len(segments) - 0.5, padding=0)
