"""The Compare censuses dialog: any two censuses of the run shown, by name: what is new,
what was freed, what grew (pytorch-memlab's users ask for exactly this)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from torchmem.events import CensusTaken
from torchmem.gui.forms import read_only_table
from torchmem.record.census_diff import diff_by_name
from torchmem.series import scope_label
from torchmem.tensors.model import KIND_LABELS
from torchmem.units import format_bytes

COLUMNS = ("Change", "Tensor", "Kind", "Before", "After", "Difference")


def census_label(index: int, taken: CensusTaken) -> str:
    """``#3 · step 40 · 12.5 s · 1.20 GiB (automatic)`` for a combo box; ``#3 · rank 1 ·
    step 40 ...`` for a census of one process of a job."""
    why = {"step": "automatic", "user": "by hand", "leak": "for a leak", "oom": "at the OOM"}
    who = f"{scope_label(taken.scope)} · " if taken.scope else ""
    return (
        f"#{index + 1} · {who}step {taken.step:,} · {taken.t:.1f} s · "
        f"{format_bytes(taken.census.total_bytes())} ({why.get(taken.trigger, taken.trigger)})"
    )


class CensusDiffDialog(QDialog):
    """Two combo boxes (before, after) over the censuses given, and their diff by name."""

    def __init__(self, censuses: list[CensusTaken], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.censuses = censuses
        self.setWindowTitle("Compare two censuses")
        self.resize(980, 560)
        self.before = QComboBox()
        self.after = QComboBox()
        for i, taken in enumerate(censuses):
            self.before.addItem(census_label(i, taken))
            self.after.addItem(census_label(i, taken))
        self.before.setToolTip("The earlier census")
        self.after.setToolTip("The later census")
        self.before.setCurrentIndex(0)
        self.after.setCurrentIndex(len(censuses) - 1)
        pick = QHBoxLayout()
        pick.addWidget(QLabel("Before:"))
        pick.addWidget(self.before, 1)
        pick.addWidget(QLabel("After:"))
        pick.addWidget(self.after, 1)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.table = read_only_table(COLUMNS, stretch=1)
        self.table.setSortingEnabled(False)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(pick)
        layout.addWidget(self.summary)
        layout.addWidget(self.table, 1)
        layout.addWidget(buttons)
        self.before.currentIndexChanged.connect(lambda _i: self.refresh())
        self.after.currentIndexChanged.connect(lambda _i: self.refresh())
        self.refresh()

    @Slot()
    def refresh(self) -> None:
        """Diff the two chosen censuses."""
        a = self.censuses[self.before.currentIndex()].census
        b = self.censuses[self.after.currentIndex()].census
        rows = diff_by_name(a, b)
        total = b.total_bytes() - a.total_bytes()
        counts = {c: sum(1 for r in rows if r.change == c) for c in ("new", "freed", "grown")}
        self.summary.setText(
            f"{format_bytes(a.total_bytes())} → {format_bytes(b.total_bytes())} "
            f"({format_bytes(total, signed=True)}): {counts['new']} new, {counts['freed']} "
            f"freed, {counts['grown']} grown, by tensor name (storages of one name summed)"
        )
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            before = f"{format_bytes(row.before)}" + (
                f" ×{row.count_before}" if row.count_before > 1 else ""
            )
            after = f"{format_bytes(row.after)}" + (
                f" ×{row.count_after}" if row.count_after > 1 else ""
            )
            cells = (
                row.change, row.name, KIND_LABELS.get(row.kind, row.kind),
                before if row.count_before else "–", after if row.count_after else "–",
                format_bytes(row.delta, signed=True),
            )  # fmt: skip
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c >= 3:
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(r, c, item)
