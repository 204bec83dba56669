"""The readings table: every series' current value and peak, with what each figure means."""

from __future__ import annotations

import math

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from torchmem.gui.bridge import SessionBridge
from torchmem.gui.plots.series_style import series_color
from torchmem.gui.view_state import ViewState
from torchmem.series import KERNEL_PEAK, METRICS
from torchmem.session import Session
from torchmem.units import format_bytes, format_duration

#: A reading older than this (seconds) next to the others is shown with its age, greyed.
STALE_AFTER_S = 3.5
#: The same for series read every few seconds (USS): any reading not of the newest
#: moment says how old it is, so that a USS read 2 s ago never stands next to this
#: moment's RSS as if of the same moment.
SPARSE_STALE_AFTER_S = 0.0


class ReadingsTable(QTableWidget):
    """One row per series: name, now, peak, share of the device's capacity.

    "Now" is only ever fresh: a reading older than :data:`STALE_AFTER_S` (USS is read every
    2 s; a series whose rank stopped reporting) shows its age and is greyed. Once the run
    has ended the column reads "Last" (the values at its end).
    """

    HEADERS = ("Series", "Now", "Peak", "Share")

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(0, len(self.HEADERS), parent)
        self.session = session
        self.setHorizontalHeaderLabels(self.HEADERS)
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QTableWidget.NoEditTriggers)
        self.setSelectionMode(QTableWidget.NoSelection)
        self.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        for col in range(1, len(self.HEADERS)):
            self.horizontalHeader().setSectionResizeMode(col, QHeaderView.ResizeToContents)
        self.horizontalHeaderItem(3).setToolTip(
            "Current value as a share of the device's total memory (RAM for host series)."
        )
        self._rows: dict[str, int] = {}
        #: The process of a job chosen in the toolbar (``rank1``, ``total``): other rows
        #: are hidden, as its curves are. None: every row.
        self.scope: str | None = None

    @Slot(object)
    def set_scope(self, scope: str | None) -> None:
        """Show only the rows of one rank (or the total), as the traces do."""
        self.scope = scope
        for key, row in self._rows.items():
            self.setRowHidden(row, not self.session.name(key).shown_in(scope))

    def bind(self, bridge: SessionBridge) -> None:
        """Refresh the figures at the bridge's redraw rate."""
        bridge.changed.connect(self.refresh)

    def bind_view_state(self, state: ViewState) -> None:
        """Show the rows of the process the window's view state chose."""
        state.scope_changed.connect(self.set_scope)
        self.set_scope(state.scope)

    def refresh(self) -> None:
        """Update every row from the Session."""
        latest = self.session.latest_timed()
        ended = self.session.run_finished is not None
        # Ages are counted from the newest reading of any series: a series that missed the
        # latest reads is stale next to the others, whatever the sampler's own pace.
        reference = max((t for _, _, t in latest.values() if math.isfinite(t)), default=0.0)
        header = "Last" if ended else "Now"
        if self.horizontalHeaderItem(1).text() != header:
            self.horizontalHeaderItem(1).setText(header)
        grey = self.palette().color(QPalette.Disabled, QPalette.Text)
        normal = self.palette().color(QPalette.Text)
        kernel = self.session.kernel_peaks()
        for key, (last, peak, when) in latest.items():
            name = self.session.name(key)
            if name.metric == KERNEL_PEAK:
                continue  # it is the RSS row's peak where higher, not a row of its own
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = self.rowCount()
                self.insertRow(row)
                item = QTableWidgetItem(name.label)
                item.setForeground(series_color(name))
                metric = name.metric
                item.setToolTip(METRICS[metric].tooltip if metric in METRICS else key)
                self.setItem(row, 0, item)
                for col in range(1, 4):
                    cell = QTableWidgetItem()
                    cell.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                    self.setItem(row, col, cell)
                self.setRowHidden(row, not name.shown_in(self.scope))
            now_item = self.item(row, 1)
            fmt = _count if name.is_count else format_bytes
            age = reference - when
            if math.isnan(last):
                now_item.setText("–")
            elif age > (SPARSE_STALE_AFTER_S if name.sparse else STALE_AFTER_S):
                old = format_duration(age, coarse=age >= 10)
                now_item.setText(f"{fmt(last)} · {old}")
                now_item.setForeground(grey)
                now_item.setToolTip(
                    f"Last read {age:.1f} s before the newest reading: it may have changed since."
                )
            else:
                now_item.setText(fmt(last))
                now_item.setForeground(normal)
                now_item.setToolTip("")
            peak_item = self.item(row, 2)
            peak_item.setText(fmt(peak) if math.isfinite(peak) else "–")
            peak_item.setToolTip(
                "The kernel's high-water mark (VmHWM): higher than every sample, as a burst "
                "between two samples was"
                if key in kernel
                else ""
            )
            total = self.session.capacity_of(name)
            counts = fmt is _count
            share = (
                f"{100 * last / total:.1f} %"
                if total and not counts and not math.isnan(last)
                else ""
            )
            self.item(row, 3).setText(share)

    def clear_rows(self) -> None:
        """Forget all rows (a new run)."""
        self.setRowCount(0)
        self._rows.clear()
        self.horizontalHeaderItem(1).setText("Now")

    def row_text(self, key: str) -> tuple[str, str, str]:
        """(label, now, peak) as shown, for tests and copy."""
        row = self._rows[key]
        return tuple(self.item(row, c).text() for c in range(3))  # type: ignore[return-value]


def _count(value: float) -> str:
    """A count (allocation retries, OOMs) as a whole number, not bytes."""
    return f"{int(value):,}"
