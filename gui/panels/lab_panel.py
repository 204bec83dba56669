"""The Lab panel: what tensor operations cost in memory and time, measured live.

Pick operations from the catalogue (or type an expression over ``a``, ``b``, ``c``), the
sizes, a dtype and a device (and a second one of either to compare), and Run: each row
is measured in a fresh process (:mod:`torchmem.lab`), drawn as it comes on two log-log
plots (peak extra memory and median time against n) and added to a table that says, for
each operation, why it costs what it costs.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from torchmem.gui.forms import (
    button,
    check_box,
    combo_box,
    line_edit,
    read_only_table,
    scrolling_column,
    spin_box,
)
from torchmem.gui.panels.job_panel import JobPanel
from torchmem.gui.theme import follow_palette
from torchmem.gui.workers import Worker
from torchmem.lab.measure import Job, Row
from torchmem.lab.ops import BUILTIN, ExpressionError, expression
from torchmem.lab.results import format_rate, format_seconds, jobs_of, write_csv
from torchmem.lab.runner import LabCancelled, LabError, run_lab
from torchmem.probe import nvml
from torchmem.units import format_bytes

#: Checked when the panel opens: the tutorial's first lesson (out of place, in place, a
#: view, a copy) and the product.
DEFAULT_OPS = ("add", "add_", "matmul", "view", "clone", "contiguous")
#: The sizes field when the panel opens; the empty plots are framed on them.
DEFAULT_SIZES = (256, 1024, 2048)
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8")
COLUMNS = (
    "Operation", "n", "Dtype", "Device", "New storage", "Peak extra", "Allocs", "Shares input",
    "Median", "Rate", "Saved for backward", "Why",
)  # fmt: skip
TOOLTIPS = (
    "The operation, or your expression",
    "Each input is an n x n tensor",
    "The inputs' dtype",
    "Where the inputs live",
    "Bytes of new storage the result owns: 0 when it is an input's own storage",
    "The most memory the operation held at once beyond its inputs (temporaries and "
    "the result); on an accelerator, the allocator's peak after a reset",
    "How many allocations the operation made",
    "Whether the result shares storage with an input (a view, or an in-place op)",
    "Median time over the repeats, after a warm-up run (synchronised on accelerators)",
    "Bandwidth (bytes read and written per second) or FLOP/s where defined",
    "With 'Inputs require grad': what autograd keeps for backward beyond the inputs",
    "Why it costs what it costs",
)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
NONE = "—"
MiB = 1 << 20


class LabWorker(Worker):
    """Measures the jobs in its own thread; each row is reported as it comes."""

    #: A row was measured.
    row_done = Signal(object)
    cancelled = (LabCancelled,)
    cancelled_text = "cancelled: the measurement in flight was ended"
    known = (LabError,)
    failed_text = "the lab failed"

    def __init__(self, jobs: list[Job], isolated: bool) -> None:
        super().__init__()
        self.jobs = jobs
        self.isolated = isolated

    def work(self) -> list[Row]:
        """Measure every job."""
        mode = "process" if self.isolated else "none"
        return run_lab(self.jobs, mode, self.row_done.emit, self.cancel_event)


class LabPanel(JobPanel):
    """Form, progress, plots and table of one lab run at a time."""

    EXPORT = ("Export the lab", "lab.csv", "CSV (*.csv);;PNG (*.png)")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[Row] = []
        self.jobs: list[Job] = []
        self._curves: dict[tuple[str, str, str], tuple[pg.PlotDataItem, pg.PlotDataItem]] = {}
        self._build()
        self._update_buttons()

    # -- building -------------------------------------------------------------------------------
    def _build(self) -> None:
        self.op_list = QListWidget()
        self.op_list.setToolTip("Built-in operations on n x n inputs a and b")
        for name, op in BUILTIN.items():
            item = QListWidgetItem(f"{name}    {op.code}")
            item.setData(Qt.UserRole, name)
            item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
            item.setCheckState(Qt.Checked if name in DEFAULT_OPS else Qt.Unchecked)
            item.setToolTip(op.why[0].upper() + op.why[1:] + ".")
            self.op_list.addItem(item)
        self.expr_edit = line_edit(
            "Any Python expression over a, b, c (n x n tensors), torch, F "
            "(torch.nn.functional) and checkpoint(fn, *inputs); measured like the built-ins",
            placeholder="your expression, e.g. torch.sigmoid(a) * b",
        )
        self.expr_edit.textChanged.connect(self._check_expression)
        self.sizes_edit = line_edit(
            "n of the n x n inputs, comma-separated", ", ".join(map(str, DEFAULT_SIZES))
        )
        self.dtype_combo = combo_box("The inputs' dtype", DTYPES)
        self.dtype2_combo = combo_box("A second dtype, measured side by side", [NONE, *DTYPES])
        devices = ["cpu", *nvml.cuda_devices()]
        self.device_combo = combo_box("Where the inputs live and the operation runs", devices)
        self.device2_combo = combo_box("A second device, measured side by side", [NONE, *devices])
        self.repeats_spin = spin_box(
            "Timed runs after one warm-up run (more for fast ops)", 1, 1000, 5
        )
        self.grad_check = check_box(
            "Inputs require grad (measure what backward keeps)",
            "The inputs require grad: each row also measures what the graph keeps for backward",
        )
        self.isolated_check = check_box(
            "Measure outside the window",
            "In the lab's own process: a CPU row in a fresh child of it, so that the heap "
            "left by earlier rows never hides a later row's allocations; a GPU row in the "
            "process itself, by the allocator's exact counters. Off: measured inside the "
            "window (faster)",
            checked=True,
        )
        self.run_button = button(
            "Run",
            "Measure every chosen operation at every size (Ctrl+Return)",
            self.start,
            shortcut="Ctrl+Return",
        )
        self.cancel_button = button(
            "Cancel", "Stop now, ending the measurement in flight", self.cancel
        )
        self.export_button = button(
            "Export…", "Save the table as CSV or the plots as PNG", self._export_dialog
        )
        self.progress = QProgressBar()
        self.progress.setFormat("")
        self.status.setText("Choose operations and sizes, then Run.")

        form = QFormLayout()
        form.addRow("Operations:", self.op_list)
        form.addRow("Expression:", self.expr_edit)
        form.addRow("Sizes (n):", self.sizes_edit)
        form.addRow("Dtype:", _pair(self.dtype_combo, self.dtype2_combo))
        form.addRow("Device:", _pair(self.device_combo, self.device2_combo))
        form.addRow("Repeats:", self.repeats_spin)
        form.addRow(self.grad_check)
        form.addRow(self.isolated_check)
        buttons = QHBoxLayout()
        for b in (self.run_button, self.cancel_button, self.export_button):
            buttons.addWidget(b)
        left = QVBoxLayout()
        left.addLayout(form, 1)
        left.addLayout(buttons)
        left.addWidget(self.progress)
        form_box = scrolling_column(left)

        self.plots = pg.GraphicsLayoutWidget()
        self.memory_plot = self.plots.addPlot(title="Peak extra memory")
        self.time_plot = self.plots.addPlot(title="Median time")
        # Binary units on the memory axis (as the table and nvidia-smi count), drawn in
        # MiB: pyqtgraph's own unit prefixes are decimal.
        for plot, label in (
            (self.memory_plot, "peak extra memory (MiB)"),
            (self.time_plot, "median time (s)"),
        ):
            plot.setLogMode(x=True, y=True)
            plot.showGrid(x=True, y=True, alpha=0.25)
            plot.setLabel("bottom", "n (inputs are n x n)")
            plot.setLabel("left", label)
            plot.getAxis("left").enableAutoSIPrefix(False)  # "(x0.001)" on a log axis
            plot.addLegend(offset=(5, 5), labelTextSize="8pt")
        follow_palette(self.plots)
        # Empty, a log axis spans one decade and labels its 2..9 on top of each other:
        # frame the default sizes and a few decades of memory and time instead.
        self._frame_sizes(set(DEFAULT_SIZES))
        self.memory_plot.setYRange(-1, 3)  # 0.1 MiB to 1 GiB
        self.time_plot.setYRange(-5, 0)  # 10 us to 1 s
        self.table = read_only_table(COLUMNS, TOOLTIPS)
        self.table.currentCellChanged.connect(self._explain_row)
        self.table.setAlternatingRowColors(True)
        right = QSplitter(Qt.Vertical)
        right.addWidget(self.plots)
        right.addWidget(self.table)
        right.setSizes([300, 260])
        body = QSplitter(Qt.Horizontal)
        body.addWidget(form_box)
        body.addWidget(right)
        body.setStretchFactor(1, 1)
        body.setSizes([330, 900])
        layout = QVBoxLayout(self)
        layout.addWidget(body, 1)
        layout.addWidget(self.status)

    def _frame_sizes(self, sizes: set[int]) -> None:
        """Ticks at ``sizes``, not at every log decade's 2..9, and the x range around them."""
        ticks = [[(math.log10(n), f"{n:,}") for n in sorted(sizes)]]
        low, high = math.log10(min(sizes)), math.log10(max(sizes))
        for plot in (self.memory_plot, self.time_plot):
            plot.getAxis("bottom").setTicks(ticks)
            plot.setXRange(low - 0.1, high + 0.1)

    # -- the form -------------------------------------------------------------------------------
    def chosen_ops(self) -> list[str]:
        """The checked built-ins, then the expression (if any)."""
        ops = [
            self.op_list.item(i).data(Qt.UserRole)
            for i in range(self.op_list.count())
            if self.op_list.item(i).checkState() == Qt.Checked
        ]
        text = self.expr_edit.text().strip()
        return ops + ([text] if text else [])

    def set_ops(self, names: list[str]) -> None:
        """Check exactly the built-ins ``names``."""
        for i in range(self.op_list.count()):
            item = self.op_list.item(i)
            item.setCheckState(Qt.Checked if item.data(Qt.UserRole) in names else Qt.Unchecked)

    @Slot(str)
    def _check_expression(self, text: str) -> None:
        if not text.strip():
            self.expr_edit.setStyleSheet("")
            return
        try:
            expression(text)
        except ExpressionError as exc:
            self.expr_edit.setStyleSheet("border: 1px solid #c0392b;")
            self.expr_edit.setToolTip(str(exc))
        else:
            self.expr_edit.setStyleSheet("")
            self.expr_edit.setToolTip("Measured like the built-ins")

    def _jobs(self) -> list[Job]:
        """The jobs of the form; ValueError (with what to fix) for anything invalid."""
        try:
            sizes = [int(s) for s in self.sizes_edit.text().replace(" ", "").split(",") if s]
        except ValueError:
            raise ValueError("sizes must be whole numbers, e.g. 256, 1024, 2048") from None
        dtypes = [self.dtype_combo.currentText()]
        if self.dtype2_combo.currentText() not in (NONE, dtypes[0]):
            dtypes.append(self.dtype2_combo.currentText())
        devices = [self.device_combo.currentText()]
        if self.device2_combo.currentText() not in (NONE, devices[0]):
            devices.append(self.device2_combo.currentText())
        return jobs_of(
            self.chosen_ops(), sizes, dtypes, devices, self.repeats_spin.value(),
            self.grad_check.isChecked(),
        )  # fmt: skip

    # -- running --------------------------------------------------------------------------------
    @Slot()
    def start(self) -> bool:
        """Measure with the form's settings; False (and why, in red) if invalid."""
        if self.running:
            return False
        try:
            self.jobs = self._jobs()
        except ValueError as exc:
            self.say(str(exc), error=True)
            return False
        self.rows = []
        self.table.setRowCount(0)
        for plot in (self.memory_plot, self.time_plot):
            plot.clear()
            if plot.legend is not None:
                plot.legend.clear()
        self._curves.clear()
        self._frame_sizes({j.size for j in self.jobs})
        self.progress.setRange(0, len(self.jobs))
        self.progress.setValue(0)
        self.progress.setFormat(f"row 1 of {len(self.jobs)}")
        where = "in the lab's own process" if self.isolated_check.isChecked() else "in the window"
        self.say(f"Measuring {len(self.jobs)} rows, {where}…")
        worker = LabWorker(self.jobs, self.isolated_check.isChecked())
        worker.row_done.connect(self._on_row)
        worker.finished.connect(self._on_finished)
        self.start_job(worker, "torchmem-lab")
        self._started = time.monotonic()
        self._update_buttons()
        return True

    @Slot(object)
    def _on_row(self, row: Row) -> None:
        self.rows.append(row)
        self._add_row(row)
        self._plot(row)
        n, total = len(self.rows), len(self.jobs)
        self.progress.setValue(n)
        left = (time.monotonic() - self._started) / n * (total - n)
        self.progress.setFormat(f"row {min(n + 1, total)} of {total} · about {left:.0f} s left")

    @Slot(object)
    def _on_finished(self, rows: list[Row]) -> None:
        self.job_ended()
        self.progress.setFormat(f"{len(self.rows)} of {len(self.jobs)} rows")
        if len(self.rows) == len(self.jobs):
            self.say(self._summary())
        self._update_buttons()

    def _summary(self) -> str:
        failed = [r for r in self.rows if r.error]
        skipped = [r for r in self.rows if r.skipped]
        flat = sorted(
            {r.op for r in self.rows if not r.error and not r.skipped and not r.peak_extra_bytes}
        )
        parts = [f"{len(self.rows)} rows measured."]
        if flat:
            parts.append(
                f"{', '.join(flat)}: no extra memory at any size (not drawn on a log axis)."
            )
        if skipped:
            parts.append(f"{len(skipped)} skipped ({skipped[0].skipped}).")
        if failed:
            parts.append(f"{len(failed)} failed: {failed[0].error}")
        return " ".join(parts)

    def _update_buttons(self) -> None:
        running = self.running
        self.run_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        self.export_button.setEnabled(bool(self.rows) and not running)
        for widget in (
            self.op_list, self.expr_edit, self.sizes_edit, self.dtype_combo,
            self.dtype2_combo, self.device_combo, self.device2_combo, self.repeats_spin,
            self.grad_check, self.isolated_check,
        ):  # fmt: skip
            widget.setEnabled(not running)

    # -- what it shows --------------------------------------------------------------------------
    def _add_row(self, row: Row) -> None:
        r = self.table.rowCount()
        self.table.insertRow(r)
        if row.skipped or row.error:
            cells = [row.op, f"{row.size:,}", row.dtype, row.device] + [""] * 7
            cells.append(f"skipped: {row.skipped}" if row.skipped else f"error: {row.error}")
        else:
            cells = [
                row.op,
                f"{row.size:,}",
                row.dtype,
                row.device,
                _bytes(row.result_bytes),
                _bytes(row.peak_extra_bytes),
                "–" if row.allocations is None else str(row.allocations),
                "yes" if row.shares_input_storage else "no",
                format_seconds(row.median_s),
                format_rate(row.rate, row.rate_unit),
                _bytes(row.saved_bytes) if row.saved_bytes is not None else "–",
                row.why,
            ]
        for col, text in enumerate(cells):
            cell = QTableWidgetItem(text)
            if col == 1 or 4 <= col <= 10:
                cell.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            tip = {0: row.code, 10: "\n".join(row.saved), 11: text}.get(col)
            if tip:
                cell.setToolTip(tip)
            if col == 11 and row.error:
                cell.setForeground(pg.mkColor("#c0392b"))
            self.table.setItem(r, col, cell)
        self.table.scrollToBottom()

    def _plot(self, row: Row) -> None:
        if row.error or row.skipped:
            return
        key = (row.op, row.dtype, row.device)
        if key not in self._curves:
            color = PALETTE[len(self._curves) % len(PALETTE)]
            style = (
                Qt.SolidLine
                if (row.dtype, row.device) == (self.jobs[0].dtype, self.jobs[0].device)
                else Qt.DashLine
            )
            name = row.op
            if len(_variants(self.jobs)) > 1:
                name = f"{row.op} ({row.dtype}, {row.device})"
            pen = pg.mkPen(color, width=2, style=style)
            brush = pg.mkBrush(color)
            self._curves[key] = (
                self.memory_plot.plot([], [], pen=pen, symbol="o", symbolBrush=brush, name=name),
                self.time_plot.plot([], [], pen=pen, symbol="o", symbolBrush=brush, name=name),
            )
        mine = [r for r in self.rows if (r.op, r.dtype, r.device) == key]
        memory = [(r.size, r.peak_extra_bytes / MiB) for r in mine if r.peak_extra_bytes]
        times = [(r.size, r.median_s) for r in mine if r.median_s]
        for curve, points in zip(self._curves[key], (memory, times), strict=True):
            curve.setData([p[0] for p in points], [p[1] for p in points])

    @Slot(int, int, int, int)
    def _explain_row(self, row: int, col: int, *_: int) -> None:
        """The selected row's reason, in full, under the table."""
        if 0 <= row < len(self.rows) and not self.running:
            r = self.rows[row]
            text = r.error or (f"skipped: {r.skipped}" if r.skipped else r.why)
            saved = f" Saved for backward: {', '.join(r.saved)}." if r.saved else ""
            self.say(f"{r.code or r.op} at n = {r.size:,} ({r.dtype}, {r.device}): {text}.{saved}")

    # -- export ---------------------------------------------------------------------------------
    def export(self, path: str) -> bool:
        """Write ``.png`` the plots, else the rows as CSV (the columns of ``torchmem lab
        --csv``); False, said in red, when it cannot be written."""
        if Path(path).suffix.lower() == ".png":
            ok = self.plots.grab().save(path)
            self.say(f"Saved {path}" if ok else f"Cannot write {path}", error=not ok)
            return ok
        try:
            write_csv(path, self.rows)
        except OSError as exc:
            self.say(f"Cannot write {path}: {exc.strerror or exc}", error=True)
            return False
        self.say(f"Saved {path}")
        return True


def _pair(first: QWidget, second: QWidget) -> QWidget:
    box = QWidget()
    row = QHBoxLayout(box)
    row.setContentsMargins(0, 0, 0, 0)
    row.addWidget(first, 1)
    row.addWidget(QLabel("vs"))
    row.addWidget(second, 1)
    return box


def _variants(jobs: list[Job]) -> set[tuple[str, str]]:
    return {(j.dtype, j.device) for j in jobs}


def _bytes(value: int | None) -> str:
    return format_bytes(value) if value is not None else "–"


__all__ = ["LabPanel", "LabWorker"]
